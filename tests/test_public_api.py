"""What a user may rely on is pinned here: ``loadlab.__all__`` and the ``__all__`` of each public
subpackage (``locust``, ``clients``, ``workloads``, ``simulate``, ``selftest``).

Everything else in the package is internal and may change between releases, and its name says
so: a module or package whose name starts with an underscore (docs/python-api.md). A change to
a list is a change to the public API: it fails this test, and the same commit updates the list
below and the docs.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import loadlab

ROOT = Path(__file__).resolve().parent.parent

# each public module's __all__, sorted (names split on spaces)
PUBLIC = {
    "loadlab": (
        "EndpointConfig Results RunConfig __version__ compare evaluate read_results "
        "render_summary render_verdict run run_sync summarize write_results"
    ).split(),
    "loadlab.locust": (
        "LLMUser OpenLoopUser StreamFailure bucket_response_time workload_specs"
    ).split(),
    "loadlab.clients": (
        "AnthropicClient AnthropicStreamState Client Completion Message OpenAIClient "
        "OpenAIStreamState PoolingClient ResponsesClient ResponsesStreamState "
        "SSEDecoder SSEEvent StreamingClient build_body make_client"
    ).split(),
    "loadlab.workloads": (
        "KINDS RequestStream WorkloadError build_requests rate_unit "
        "resolve_workload_paths validate_workload workload_extra"
    ).split(),
    "loadlab.simulate": (
        "LinearStepTime MODES RoleStepTime RooflineStepTime ServerConfig SimOutput "
        "Simulator StepTimeModel is_predicted simulate to_results"
    ).split(),
    "loadlab.selftest": ("FixedServerProcess").split(),
}

# The package root holds these modules and no others (subpackages hold the rest).
ROOT_MODULES = {
    "__init__",
    "__main__",
    "_version",
    "api",
    "cli",
    "config",
    "_headers",
    "_limits",
    "errors",
    "journal",
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
    assert len({m for m in found if not m.startswith("_")}) <= 10


def test_internal_modules_are_private() -> None:
    """Outside the public root modules and the public subpackages' ``__init__`` (and
    ``__main__``), every module's path has a part that starts with an underscore."""
    public_packages = {m.split(".")[1] for m in PUBLIC if m != "loadlab"}
    exposed = []
    for path in sorted((ROOT / "loadlab").rglob("*.py")):
        parts = path.relative_to(ROOT / "loadlab").with_suffix("").parts
        if any(p.startswith("_") and p not in ("__init__", "__main__") for p in parts):
            continue
        if len(parts) == 1 or (
            parts[0] in public_packages and len(parts) == 2 and parts[1] in ("__init__", "__main__")
        ):
            continue
        exposed.append("/".join(parts))
    assert not exposed, exposed


def test_test_helpers_are_not_in_the_package() -> None:
    assert not (ROOT / "loadlab" / "testing").exists()
