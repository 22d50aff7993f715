"""The flags of a run, defined once for every command that runs (or simulates) a load:
``loadlab run``, ``loadlab sweep`` (each level is a run) and ``loadlab simulate``.

``add_run_arguments(parser)`` adds them in groups (load, workload, request, output, then the
rare ones); ``config_from_args(args)`` turns what was given into a ``RunConfig``: the scenario
file first (if any), then every flag that was given (argparse defaults are None, so "given" is
known). A flag that is not given leaves ``RunConfig``'s default, which ``--help`` shows.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from loadlab._headers import check_header
from loadlab.config import APIS, DEMO, EndpointConfig, RunConfig, extra_body_from_flag
from loadlab.errors import ConfigError

__all__ = ["add_run_arguments", "config_from_args", "refuse_shards"]

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)}
_ENDPOINT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EndpointConfig)}


def _default(name: str, unit: str = "") -> str:
    """`` (default: X)`` from ``RunConfig`` (or ``EndpointConfig``): one place for defaults."""
    value = _DEFAULTS.get(name, _ENDPOINT_DEFAULTS.get(name))
    return f" (default: {value:g}{unit})" if isinstance(value, float) else f" (default: {value})"


def _seconds(g: argparse._ArgumentGroup, flag: str, field: str, help: str) -> None:
    """A flag in seconds whose default ``RunConfig`` holds (``--help`` shows it)."""
    g.add_argument(flag, type=float, metavar="S", help=help + _default(field, " s"))


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Every run flag, in groups a person can scan: the common ones first, the rare ones last."""
    g = p.add_argument_group(
        "load",
        "one of --rate or --concurrency, and --duration or --requests to stop; with neither "
        "--endpoint nor --scenario, a short demo chat load on the embedded reference server",
    )
    g.add_argument("--rate", type=float, metavar="RPS", help="open loop: requests per second")
    g.add_argument("--concurrency", type=int, metavar="C", help="closed loop: concurrent streams")
    g.add_argument("--duration", type=float, metavar="S", help="stop sending after S seconds")
    g.add_argument("--requests", type=int, metavar="N", help="stop after N requests")
    g.add_argument("--arrival", choices=["poisson", "constant", "gamma"],
                   help="open-loop arrival process" + _default("arrival"))  # fmt: skip
    g.add_argument("--cv", type=float,
                   help="gamma arrivals: coefficient of variation (burstiness)" + _default("cv"))  # fmt: skip
    g.add_argument("--max-in-flight", type=int, metavar="N",
                   help="open loop: cap; over it requests drop (default: no cap)")  # fmt: skip
    _seconds(g, "--warmup", "warmup_s", "seconds left out at the start of the window")
    _seconds(g, "--cooldown", "cooldown_s", "seconds left out at the end of the window")

    g = p.add_argument_group("workload")
    g.add_argument("--scenario", metavar="FILE", help="TOML scenario file (flags override it)")
    g.add_argument("--prompt-tokens", type=int, metavar="P",
                   help="prompt length in tokens" + _default("prompt_tokens"))  # fmt: skip
    g.add_argument("--max-tokens", type=int, metavar="M",
                   help="output tokens asked per request" + _default("max_tokens"))  # fmt: skip
    g.add_argument("--seed", type=int,
                   help="seed of the workload and arrivals: give a run's seed to repeat it "
                        "(default: a fresh one per run, printed and recorded)")  # fmt: skip
    g.add_argument("--tokenizer", metavar="SPEC",
                   help="size prompts exactly as the server counts them: a tokenizer folder, "
                        "tokenizer.json, tiktoken file or cached model id; 'server' (its "
                        "/tokenize), 'calibrate', 'auto', 'byte', 'none'" + _default("tokenizer"))  # fmt: skip
    g.add_argument("--exact-output", action="store_true", default=None,
                   help="ask for exactly --max-tokens output tokens (ignore_eos/min_tokens "
                        "where supported)")  # fmt: skip
    g.add_argument("--cache-bust", action="store_true", default=None,
                   help="start cold: a salt unique to this run after each prompt's first word, "
                        "so the server's prefix cache has none of them; the workload, its "
                        "lengths and its sharing within the run unchanged")  # fmt: skip

    g = p.add_argument_group("request")
    g.add_argument("--endpoint", action="append", metavar="[NAME=]URL",
                   help="server base URL (repeatable: endpoints side by side; default: the "
                        "embedded reference server)")  # fmt: skip
    g.add_argument("--model", help="model name sent in each request" + _default("model"))
    g.add_argument("--api", choices=list(APIS), help="API flavour" + _default("api"))
    g.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    g.add_argument(
        "--header", action="append", metavar="K:V", help="extra HTTP header (repeatable)"
    )
    g.add_argument("--no-stream", action="store_true", default=None, help="non-streaming requests")
    g.add_argument("--extra-body", metavar="JSON",
                   help="extra request fields, e.g. '{\"ignore_eos\": true}'")  # fmt: skip
    _seconds(g, "--timeout", "timeout_s", "whole-request timeout")
    _seconds(g, "--read-timeout", "read_timeout_s", "longest silence inside a stream")

    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="FILE",
                   help="results file (default: reports/run-<UTC time>.json)")  # fmt: skip
    g.add_argument("--slo", metavar="FILE", help="SLO file: the exit code follows the verdict")
    g.add_argument("--scrape", metavar="URL", help="Prometheus /metrics URL sampled during the run")
    _seconds(g, "--scrape-interval", "scrape_interval_s", "scrape period")
    g.add_argument("--no-progress", action="store_true", default=None, help="no live progress line")

    g = p.add_argument_group("cost and energy (docs/cost.md)")
    g.add_argument("--pricing", metavar="FILE",
                   help="prices (TOML): an API vendor's per million tokens, or GPU-hours")  # fmt: skip
    g.add_argument("--price", action="append", metavar="[ENDPOINT:]KEY=VALUE,..",
                   help="a price, e.g. output=0.6,input=0.15 or gpu_hour=2.5,gpus=8 (repeatable)")  # fmt: skip
    g.add_argument("--gpu-metrics", action="append", metavar="[ENDPOINT=]URL|nvml",
                   help="sample GPUs during the run: a DCGM exporter's /metrics URL, or NVML here")  # fmt: skip
    _seconds(g, "--gpu-interval", "gpu_interval_s", "GPU sample period")
    _seconds(g, "--gpu-baseline", "gpu_baseline_s",
             "seconds of idle GPU samples before the first request")  # fmt: skip

    g = p.add_argument_group("shared prefixes (workload kind 'prefix'; docs/workloads.md)")
    g.add_argument("--prefix-tokens", type=int, metavar="N", help="tokens of each shared prefix")
    g.add_argument("--prefixes", type=int, metavar="P",
                   help="distinct prefixes (1: a system prompt)")  # fmt: skip
    g.add_argument("--requests-per-prefix", type=int, metavar="M", help="requests per prefix")
    g.add_argument("--suffix-tokens", type=int, metavar="S", help="unique tokens after the prefix")
    g.add_argument("--prefix-order", choices=["random", "grouped", "round_robin"])
    g.add_argument("--cache-block-size", type=int, metavar="B",
                   help="the server's KV block size, for the block-aligned expected hit rate")  # fmt: skip

    g = p.add_argument_group("advanced")
    g.add_argument("--workers", type=int, metavar="N",
                   help="spread the load over N processes" + _default("workers"))  # fmt: skip
    g.add_argument("--shard", type=_shard, metavar="K/N",
                   help="run part K of N of the schedule (one machine of N; needs --seed; "
                        "join the parts with loadlab merge: docs/distributed.md)")  # fmt: skip
    g.add_argument("--start-at", type=_wall_time, metavar="TIME",
                   help="start at this wall-clock time (Unix seconds or ISO 8601), as the "
                        "other shards do")  # fmt: skip
    g.add_argument("--interleave", action="store_true", default=None,
                   help="several endpoints at once, on one schedule (default: one after another)")  # fmt: skip
    g.add_argument(
        "--endpoint-model", action="append", metavar="NAME=MODEL", help="one endpoint's model"
    )
    g.add_argument(
        "--endpoint-api", action="append", metavar="NAME=API", help="one endpoint's API flavour"
    )
    g.add_argument("--endpoint-key-env", action="append", metavar="NAME=VAR",
                   help="one endpoint's key variable")  # fmt: skip
    g.add_argument("--redact-header", action="append", metavar="NAME",
                   help="also store and print this header as *** (repeatable; credential-like "
                        "names such as Authorization, Cookie, *key*, *token*, *secret*, *auth* "
                        "always are)")  # fmt: skip
    g.add_argument("--transport", choices=["raw", "aiohttp"],
                   help="HTTP transport: raw (exact read times, least CPU) or aiohttp (proxies)"
                        + _default("transport"))  # fmt: skip
    g.add_argument("--max-event-bytes", type=int, metavar="N",
                   help="longest SSE line or event, or non-streamed body; over it the request "
                        "is a protocol_error and its connection is closed (default: "
                        f"{RunConfig.max_event_bytes >> 20} MiB)")  # fmt: skip
    g.add_argument("--saturation-lag-ms", type=float, metavar="MS",
                   help="generator-saturation threshold (event-loop lag p99)"
                        + _default("saturation_lag_ms", " ms"))  # fmt: skip


# flag attribute -> RunConfig field (for the flags that map one to one)
def refuse_shards(args: argparse.Namespace, command: str, why: str) -> None:
    """``ConfigError`` when ``--shard`` or ``--start-at`` is given to a command whose load
    is not one run split over machines (``why``: what it does instead, and what to do)."""
    given = [flag for flag, key in (("--shard", "shard"), ("--start-at", "start_at"))
             if getattr(args, key, None) is not None]  # fmt: skip
    if given:
        raise ConfigError(f"{command} takes no {' or '.join(given)}: {why}")


def _shard(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected K/N, e.g. 0/4 (part 0 of 4)")
    return int(k), int(n)


def _wall_time(text: str) -> float:
    from datetime import datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected Unix seconds (e.g. $(date +%s)) or ISO 8601 time"
        ) from None


_FIELDS = {
    "rate": "rate_rps",
    "arrival": "arrival",
    "cv": "cv",
    "max_in_flight": "max_in_flight",
    "concurrency": "concurrency",
    "duration": "duration_s",
    "requests": "requests",
    "warmup": "warmup_s",
    "cooldown": "cooldown_s",
    "prompt_tokens": "prompt_tokens",
    "max_tokens": "max_tokens",
    "seed": "seed",
    "tokenizer": "tokenizer",
    "workers": "workers",
    "shard": "shard",
    "start_at": "start_at",
    "timeout": "timeout_s",
    "max_event_bytes": "max_event_bytes",
    "read_timeout": "read_timeout_s",
    "transport": "transport",
    "out": "out",
    "slo": "slo",
    "scrape": "scrape",
    "scrape_interval": "scrape_interval_s",
    "interleave": "interleave",
    "saturation_lag_ms": "saturation_lag_ms",
    "gpu_interval": "gpu_interval_s",
    "gpu_baseline": "gpu_baseline_s",
}


def _endpoints(args: argparse.Namespace, base: tuple[EndpointConfig, ...]) -> list[EndpointConfig]:
    eps = list(base)
    if args.endpoint:
        eps = []
        for i, text in enumerate(args.endpoint):
            name, sep, url = text.partition("=")
            if not sep or name.startswith(("http://", "https://")):
                name, url = ("default" if len(args.endpoint) == 1 else f"ep{i}"), text
            eps.append(EndpointConfig(url=url, name=name))
    headers: dict[str, str] = {}
    for h in args.header or []:
        key, sep, value = h.partition(":")
        if not sep or not key.strip():
            raise ConfigError(f"--header must look like Name:value, got {h!r}")
        check_header(key.strip(), value.strip())  # also with no --endpoint (embedded server)
        headers[key.strip()] = value.strip()
    changes: dict[str, Any] = {
        k: v
        for k, v in {"model": args.model, "api": args.api, "api_key_env": args.api_key_env}.items()
        if v is not None
    }
    per = _per_endpoint(args, {ep.name for ep in eps})
    out = []
    for ep in eps:
        d = {**vars(ep), **changes, **per.get(ep.name, {})}
        if headers:
            d["headers"] = {**ep.headers, **headers}
        out.append(EndpointConfig(**d))
    if len({ep.name for ep in out}) != len(out):
        raise ConfigError("endpoint names must differ: use --endpoint NAME=URL for each")
    return out


# --endpoint-<flag> NAME=VALUE -> EndpointConfig field (a vendor comparison: each its own)
_PER_ENDPOINT = {
    "endpoint_model": "model",
    "endpoint_api": "api",
    "endpoint_key_env": "api_key_env",
}


def _per_endpoint(args: argparse.Namespace, names: set[str]) -> dict[str, dict[str, str]]:
    """``{endpoint name: {field: value}}`` from the ``--endpoint-model/-api/-key-env`` flags."""
    out: dict[str, dict[str, str]] = {}
    for attr, field_name in _PER_ENDPOINT.items():
        flag = "--" + attr.replace("_", "-")
        for text in getattr(args, attr, None) or []:
            name, sep, value = text.partition("=")
            if not sep or not value:
                raise ConfigError(f"{flag} must look like NAME=VALUE, got {text!r}")
            if name not in names:
                known = ", ".join(sorted(names)) or "none (give --endpoint NAME=URL)"
                raise ConfigError(
                    f"{flag} {text!r}: no endpoint named {name!r}; endpoints: {known}"
                )
            out.setdefault(name, {})[field_name] = value
    return out


# flag attribute -> key of a "prefix" workload
_PREFIX_FLAGS = {
    "prefix_tokens": "prefix_tokens",
    "prefixes": "prefixes",
    "requests_per_prefix": "requests_per_prefix",
    "suffix_tokens": "suffix_tokens",
    "prefix_order": "order",
    "cache_block_size": "block_size",
}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The scenario file (if any), then every flag that was given; the demo without both."""
    given = {f: getattr(args, a) for a, f in _FIELDS.items() if getattr(args, a) is not None}
    if "rate_rps" in given and "concurrency" in given:
        raise ConfigError("give either --rate (open loop) or --concurrency (closed loop), not both")
    fields: dict[str, Any] = {}
    base_endpoints: tuple[EndpointConfig, ...] = ()
    if args.scenario:
        from loadlab.scenario import load_scenario

        base = load_scenario(args.scenario, overrides=given)  # flags win, checked together
        fields = {k: getattr(base, k) for k in base.to_dict()}
        base_endpoints = base.endpoints
    if "rate_rps" in given:
        fields["concurrency"] = None
    if "concurrency" in given:
        fields["rate_rps"] = None
    fields.update(given)
    if args.extra_body is not None:
        fields["extra_body"] = extra_body_from_flag(args.extra_body)
    if args.redact_header:
        fields["redact_headers"] = tuple(args.redact_header)
    if args.no_stream:
        fields["stream"] = False
    if args.no_progress:
        fields["progress"] = False
    fields["endpoints"] = tuple(_endpoints(args, base_endpoints))
    _cost_flags(args, fields)
    if not fields["endpoints"] and not args.scenario:
        demo = dict(DEMO)
        if "rate_rps" in given:
            demo.pop("concurrency")
        if "duration_s" in given or "requests" in given:  # the user's stop rule alone
            demo.pop("duration_s")
            demo.pop("requests")
        for key, value in demo.items():
            fields.setdefault(key, value)
    _workload_flags(args, fields)
    return RunConfig(**fields)


def _cost_flags(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    """``--pricing``, ``--price`` and ``--gpu-metrics`` over the scenario's tables, by endpoint
    name (``*``: every endpoint); a shared pricing file may name endpoints this run lacks."""
    if getattr(args, "pricing", None) or getattr(args, "price", None):
        from loadlab._analysis.cost import pricing_tables

        fields["pricing"] = pricing_tables(args.pricing, args.price, fields.get("pricing"))
    gpu = dict(fields.get("gpu_metrics") or {})
    for text in getattr(args, "gpu_metrics", None) or []:
        name, sep, source = text.partition("=")
        if not sep or name.startswith(("http://", "https://")):
            name, source = "*", text
        gpu[name] = source
    if gpu:
        fields["gpu_metrics"] = gpu
    names = {ep.name for ep in fields["endpoints"]}
    unknown = sorted(set(gpu) - names - {"*"}) if names else []
    if unknown:
        raise ConfigError(f"--gpu-metrics: no endpoint named {', '.join(unknown)}; "
                          f"endpoints: {', '.join(sorted(names))}")  # fmt: skip
    if names and fields.get("pricing"):
        from loadlab._analysis.cost import unpriced

        unpriced(fields["pricing"], names)


def _workload_flags(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    """The flags that change ``[workload]``: the prefix flags (over the scenario's prefix
    workload, else a prefix workload of their own), ``--exact-output``, ``--cache-bust`` (any
    workload, its kind and lengths unchanged: its prompts unseen), and ``--tokenizer``, which
    replaces a scenario's ``chars_per_token`` estimate."""
    workload = dict(fields.get("workload") or {"kind": "synthetic"})
    prefix = {key: getattr(args, attr) for attr, key in _PREFIX_FLAGS.items()
              if getattr(args, attr, None) is not None}  # fmt: skip
    if prefix:
        base = workload if workload.get("kind") == "prefix" else {}
        workload = {**base, "kind": "prefix", **prefix}
    if args.tokenizer is not None:
        workload.pop("chars_per_token", None)
    if args.exact_output:
        workload["exact_output"] = True
    if args.cache_bust:
        workload["cache_bust"] = True
    fields["workload"] = workload
