"""What pytest collects in this checkout (the suite runs doctests: ``--doctest-modules``).

- Modules that import Locust are never imported here: Locust's gevent monkey-patches the
  interpreter, which breaks every asyncio test after it. Their tests, and the examples of
  loadlab/locust/_user.py, run in processes of their own (tests/locust/).
- Under tests/, only ``test_*.py`` files are test modules; helpers, drivers and locustfiles are
  imported by the tests that need them (or run by Locust), never collected on their own.
- In CI (``CI`` set), Hypothesis draws the same examples every run and keeps no database: a
  property test then fails on every run or on none. Locally it explores new examples, which is
  how it found the static-batching leak (66de397).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent

# Relative to ROOT.
_IMPORTS_GEVENT = {
    "loadlab/locust/_user.py",
    "loadlab/locust/_hooks.py",
    "loadlab/locust/_stream.py",
    "loadlab/locust/_openloop.py",
    "loadlab/locust/_sender.py",
}


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if collection_path.suffix != ".py":
        return None
    try:
        rel = collection_path.relative_to(ROOT)
    except ValueError:
        return None
    if rel.as_posix() in _IMPORTS_GEVENT:
        return True
    name = collection_path.name
    if rel.parts[0] == "tests" and not name.startswith("test_"):
        return name not in ("conftest.py", "__init__.py")
    return None
