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

import math
from typing import Any

from loadlab._headers import public_url
from loadlab._limits import MAX_DURATION_S, MAX_TOKENS
from loadlab.config import EndpointConfig
from loadlab.errors import ConfigError

__all__ = [
    "OPTION_NAMES",
    "add_options",
    "check_options",
    "config_from_options",
    "endpoint_from_options",
]

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
            "help": "loadlab results file written at exit "
            "(default reports/locust-<UTC time>-<pid>.json)",
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


# option -> (lowest, highest, whether the lowest itself is allowed)
_RANGES: dict[str, tuple[float, float, bool]] = {
    "prompt_tokens": (1, MAX_TOKENS, True),
    "max_tokens": (1, MAX_TOKENS, True),
    "turns": (1, MAX_TOKENS, True),
    "think_time": (0, MAX_DURATION_S, True),
    "request_timeout": (0, MAX_DURATION_S, False),
    "read_timeout": (0, MAX_DURATION_S, False),
    "loadlab_final_wait": (0, MAX_DURATION_S, True),
    "saturation_lag_ms": (0, MAX_DURATION_S * 1000, False),
}


def check_options(opts: Any) -> None:
    """loadlab's options, checked before any user starts (the master's, or the single
    process's): raises ``ConfigError`` naming the flag and what it takes. ``--loadlab-out``
    is checked by starting its journal (``loadlab.journal.prepare_output``)."""
    for name, (lo, hi, closed) in _RANGES.items():
        value = getattr(opts, name, None)
        if value is None:
            continue
        x = float(value)
        if not (math.isfinite(x) and (x >= lo if closed else x > lo) and x <= hi):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} must be a finite number {'>=' if closed else '>'} {lo:g} and "
                f"<= {hi:,.0f}, got {value}"
            )
    if getattr(opts, "slo", ""):
        from loadlab._slo import load_slo

        load_slo(opts.slo)


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
