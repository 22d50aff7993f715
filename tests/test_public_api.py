"""What a user may rely on is pinned here: ``loadlab.__all__`` and ``loadlab.locust.__all__``.

Everything else in the package is internal and may change between releases
(docs/python-api.md). A change to either list is a change to the public API: it fails this
test, and the same commit updates the list below and the docs.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import loadlab

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = {
    "loadlab": [
        "EndpointConfig",
        "Results",
        "RunConfig",
        "__version__",
        "evaluate",
        "read_results",
        "run",
        "run_sync",
        "summarize",
        "write_results",
    ],
    "loadlab.locust": ["LLMUser", "StreamFailure", "bucket_response_time", "workload_specs"],
}

# The package root holds these modules and no others (subpackages hold the rest).
ROOT_MODULES = {
    "__init__",
    "__main__",
    "_version",
    "api",
    "cli",
    "config",
    "errors",
    "headers",
    "journal",
    "limits",
    "records",
    "results",
    "scenario",
}


def test_public_names_are_pinned() -> None:
    for module, names in PUBLIC.items():
        if module == "loadlab.locust":
            # importing locust monkey-patches this process with gevent; read the list from source
            src = (ROOT / "loadlab" / "locust" / "__init__.py").read_text()
            assert "__all__" in src
            ns: dict[str, object] = {}
            start = src.index("__all__")
            end = src.index("]", start) + 1
            exec(src[start:end], ns)  # noqa: S102 - our own source, a list literal
            assert sorted(ns["__all__"]) == sorted(names), module  # type: ignore[arg-type]
            continue
        assert sorted(importlib.import_module(module).__all__) == sorted(names), module


def test_every_public_name_resolves() -> None:
    for name in loadlab.__all__:
        assert getattr(loadlab, name) is not None, name


def test_package_root_is_small() -> None:
    found = {p.stem for p in (ROOT / "loadlab").glob("*.py")}
    assert found == ROOT_MODULES, sorted(found ^ ROOT_MODULES)
    assert len(found - {"__init__", "__main__", "_version"}) <= 10


def test_test_helpers_are_not_in_the_package() -> None:
    assert not (ROOT / "loadlab" / "testing").exists()
