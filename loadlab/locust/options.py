"""loadlab's options on Locust's own command line (``events.init_command_line_parser``).

They appear in ``locust --help`` under "loadlab", in the web UI's custom parameters, and are
forwarded by the master to its workers (Locust ships custom options with each spawn).
No Locust import here: the parser is whatever Locust hands over.

Example::

    locust -f scenarios/chat.py --host http://127.0.0.1:8000 --model loadlab-ref \\
        --api chat --api-key-env OPENAI_API_KEY --prompt-tokens 256 --max-tokens 128 \\
        --turns 3 --think-time 2 --loadlab-out reports/chat.json --slo slo.toml
"""

from __future__ import annotations

import time
from typing import Any

from loadlab.config import EndpointConfig
from loadlab.headers import public_url

__all__ = ["OPTION_NAMES", "add_options", "config_from_options", "endpoint_from_options"]

# (flag, argparse kwargs). Kept as data so config_from_options can list exactly these.
_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--model", {"default": "loadlab-ref", "help": "model name sent in each request"}),
    (
        "--api",
        {
            "default": "chat",
            "choices": ["chat", "completions"],
            "help": "OpenAI API: chat (/v1/chat/completions) or completions (/v1/completions)",
        },
    ),
    (
        "--api-key-env",
        {"default": "", "help": "name of the environment variable holding the API key"},
    ),
    ("--prompt-tokens", {"type": int, "default": 128, "help": "prompt length in tokens"}),
    ("--max-tokens", {"type": int, "default": 64, "help": "max output tokens per request"}),
    ("--turns", {"type": int, "default": 3, "help": "chat: turns per session"}),
    (
        "--think-time",
        {"type": float, "default": 1.0, "help": "chat: mean seconds between a session's turns"},
    ),
    ("--loadlab-seed", {"type": int, "default": 0, "help": "workload seed"}),
    (
        "--request-timeout",
        {"type": float, "default": 120.0, "help": "seconds for a whole request"},
    ),
    (
        "--read-timeout",
        {"type": float, "default": 30.0, "help": "longest silence inside a stream (s)"},
    ),
    (
        "--loadlab-out",
        {
            "default": "",
            "help": "loadlab results file written at exit (default reports/locust-<UTC time>.json)",
        },
    ),
    ("--slo", {"default": "", "help": "SLO file (TOML): the exit code follows its verdict"}),
    (
        "--loadlab-final-wait",
        {
            "type": float,
            "default": 15.0,
            "help": "seconds the master waits for workers' last records at stop",
        },
    ),
    (
        "--itl-rows",
        {
            "default": "gaps",
            "choices": ["gaps", "none"],
            "help": "Locust ITL row: one sample per token gap, or none (saves CPU)",
        },
    ),
    (
        "--saturation-lag-ms",
        {
            "type": float,
            "default": 20.0,
            "help": "gevent loop lag past which a worker counts as saturated",
        },
    ),
]

OPTION_NAMES = [flag[2:].replace("-", "_") for flag, _ in _OPTIONS]


def add_options(parser: Any) -> None:
    """Add loadlab's options to Locust's parser (a configargparse parser)."""
    group = parser.add_argument_group("loadlab", "LLM streaming metrics and results (loadlab)")
    for flag, kwargs in _OPTIONS:
        group.add_argument(flag, **kwargs)


def endpoint_from_options(opts: Any, host: str | None) -> EndpointConfig:
    """The endpoint a user talks to: ``--host`` plus ``--model``, ``--api``, ``--api-key-env``."""
    if not host:
        raise ValueError("give the endpoint's base URL: --host http://127.0.0.1:8000")
    return EndpointConfig(
        url=host.rstrip("/"),
        name="locust",
        model=str(getattr(opts, "model", "loadlab-ref")),
        api=str(getattr(opts, "api", "chat")),
        api_key_env=getattr(opts, "api_key_env", "") or None,
    )


def default_out_path() -> str:
    return time.strftime("reports/locust-%Y%m%dT%H%M%SZ.json", time.gmtime())


def config_from_options(opts: Any) -> dict[str, Any]:
    """What the results file's ``config`` records: Locust's load shape plus loadlab options."""
    cfg: dict[str, Any] = {name: getattr(opts, name, None) for name in OPTION_NAMES}
    for name in (
        "host",
        "num_users",
        "spawn_rate",
        "run_time",
        "stop_timeout",
        "locustfile",
        "expect_workers",
        "processes",
    ):
        cfg[f"locust_{name}"] = getattr(opts, name, None)
    if cfg["locust_host"]:
        cfg["locust_host"] = public_url(str(cfg["locust_host"]))
    return cfg
