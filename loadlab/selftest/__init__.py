"""``loadlab selftest``: loadlab's timing held against a server that logs its own truth.

``FixedServerProcess`` starts that server (a fixed schedule: first token after ``ttft_ms``, then
one every ``itl_ms``; arrivals stamped with the kernel's clock) in its own process::

    from loadlab.selftest import FixedServerProcess

    with FixedServerProcess(ttft_ms=20, itl_ms=5, tokens=8) as url:
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadlab.selftest._fixed_server import FixedServerProcess

__all__ = ["FixedServerProcess"]


def __getattr__(name: str) -> Any:
    """The server class, imported when first used (the selftest command needs more)."""
    if name == "FixedServerProcess":
        from loadlab.selftest._fixed_server import FixedServerProcess

        return FixedServerProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
