"""Locust integration: ``LLMUser`` streams from an OpenAI-compatible endpoint with exact timing.

In a locustfile::

    from loadlab.locust import LLMUser, workload_specs

The modules, from the socket up::

    stream    one streaming request under gevent (a gevent socket, loadlab's HTTP reader)
    options   loadlab's options on Locust's command line (no Locust import)
    collect   records across workers: what a worker ships, how the master merges (pure data)
    hooks     Locust event listeners: ship records, end distributed runs cleanly, write the file
    user      ``LLMUser``, ``workload_specs``; importing it installs the hooks

Importing ``locust`` monkey-patches the interpreter with gevent, so this package imports
``user`` only when one of its names is asked for (a module ``__getattr__``):
``import loadlab.locust._collect`` or ``loadlab.locust._options`` never loads Locust or gevent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadlab.locust._openloop import OpenLoopUser
    from loadlab.locust._user import LLMUser, StreamFailure, bucket_response_time, workload_specs

__all__ = ["LLMUser", "OpenLoopUser", "StreamFailure", "bucket_response_time", "workload_specs"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from loadlab.errors import require

        require("locust", f"loadlab.locust.{name}")  # a clear line, not gevent's traceback
        home = "loadlab.locust._openloop" if name == "OpenLoopUser" else "loadlab.locust._user"
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
