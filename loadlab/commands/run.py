"""``loadlab run``: run a load test and write a results file.

    loadlab run                                   # the embedded reference server, a short chat load
    loadlab run --endpoint http://127.0.0.1:8000 --model m --rate 4 --duration 60 \\
        --prompt-tokens 512 --max-tokens 128 --out reports/r.json
    loadlab run --scenario scenarios/chat.toml --rate 8      # flags override the scenario
    loadlab run --endpoint a=http://h1:8000 --endpoint b=http://h2:8000 --concurrency 8 --requests 200
    loadlab run --endpoint ours=http://h1:8000 --endpoint claude=https://api.anthropic.com \
        --endpoint-api claude=anthropic --endpoint-model claude=claude-x \
        --endpoint-key-env claude=ANTHROPIC_API_KEY --rate 2 --requests 100   # vendor comparison

Every flag maps to a ``RunConfig`` field; a flag that is not given leaves the scenario's value
(argparse defaults are None so "given" is known).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadlab.analysis.generator import saturation_warning
from loadlab.analysis.token_checks import prompt_match, prompt_warning
from loadlab.config import APIS, EndpointConfig, RunConfig
from loadlab.errors import TOO_DEEP, ConfigError, UsageError, require
from loadlab.headers import check_header
from loadlab.journal import prepare_output
from loadlab.results import Results, write_results
from loadlab.runner import signals
from loadlab.runner.workers import BuildRequests, run_endpoint, run_load

__all__ = ["add_arguments", "config_from_args", "run"]


# The README's first command: no endpoint, no scenario. Small enough to finish in about a
# minute on 2 CPU cores against the embedded reference server, big enough to show percentiles.
DEMO_DEFAULTS: dict[str, Any] = {
    "concurrency": 4,
    "requests": 24,
    "duration_s": 45.0,  # a cap on a slow machine; 24 requests usually end it sooner
    "prompt_tokens": 64,
    "max_tokens": 32,
    "workload": {
        "kind": "chat",
        "turns": 2,
        "think_time_s": 0.5,
        "prompt_tokens": 64,
        "output_tokens": 32,
    },
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--endpoint", action="append", metavar="[NAME=]URL", help="server base URL (repeatable)")
    a("--model", help="model name sent in each request")
    a("--api", choices=list(APIS), help="API flavour (default chat)")
    a("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    a("--header", action="append", metavar="K:V", help="extra HTTP header (repeatable)")
    a(
        "--redact-header",
        action="append",
        metavar="NAME",
        help="also store and print this header as *** (repeatable; credential-like names "
        "such as Authorization, Cookie, *key*, *token*, *secret*, *auth* always are)",
    )
    a("--endpoint-model", action="append", metavar="NAME=MODEL", help="one endpoint's model")
    a("--endpoint-api", action="append", metavar="NAME=API", help="one endpoint's API flavour")
    a("--endpoint-key-env", action="append", metavar="NAME=VAR", help="one endpoint's key variable")
    a("--rate", type=float, metavar="RPS", help="open loop: requests per second")
    a("--arrival", choices=["poisson", "constant", "gamma"], help="open-loop arrival process")
    a("--cv", type=float, help="gamma arrivals: coefficient of variation (burstiness)")
    a("--max-in-flight", type=int, metavar="N", help="open loop: cap; over it requests drop")
    a("--concurrency", type=int, metavar="C", help="closed loop: concurrent streams")
    a("--duration", type=float, metavar="S", help="stop sending after S seconds")
    a("--requests", type=int, metavar="N", help="stop after N requests")
    a("--warmup", type=float, metavar="S", help="seconds excluded at the start of the window")
    a("--cooldown", type=float, metavar="S", help="seconds excluded at the end of the window")
    a("--prompt-tokens", type=int, metavar="P", help="prompt length in tokens")
    a("--max-tokens", type=int, metavar="M", help="output tokens asked per request")
    a(
        "--tokenizer",
        metavar="SPEC",
        help="size prompts exactly as the server counts them: a tokenizer folder, tokenizer.json, "
        "tiktoken file or cached model id; 'server' (its /tokenize), 'calibrate', 'auto', 'none'",
    )
    a(
        "--exact-output",
        action="store_true",
        default=None,
        help="ask for exactly --max-tokens output tokens (ignore_eos/min_tokens where supported)",
    )
    a("--extra-body", metavar="JSON", help="extra request fields, e.g. '{\"ignore_eos\": true}'")
    a("--no-stream", action="store_true", default=None, help="non-streaming requests")
    a("--seed", type=int, help="seed of the workload and arrivals")
    a("--workers", type=int, metavar="N", help="spread the load over N processes")
    a("--timeout", type=float, metavar="S", help="whole-request timeout in seconds")
    a(
        "--max-event-bytes",
        type=int,
        metavar="N",
        help="longest SSE line or event, or non-streamed body (default 4 MiB); "
        "over it the request is a protocol_error and its connection is closed",
    )
    a("--read-timeout", type=float, metavar="S", help="longest silence inside a stream")
    a(
        "--transport",
        choices=["raw", "aiohttp"],
        help="HTTP transport: raw (default, exact read times, least CPU) or aiohttp (proxies)",
    )
    a("--out", metavar="FILE", help="results file (default reports/run-<UTC time>.json)")
    a("--scenario", metavar="FILE", help="TOML scenario file (flags override it)")
    a("--slo", metavar="FILE", help="SLO file: the exit code follows the verdict")
    a("--scrape", metavar="URL", help="Prometheus /metrics URL sampled during the run")
    a("--scrape-interval", type=float, metavar="S", help="scrape period in seconds")
    a("--interleave", action="store_true", default=None, help="several endpoints at once")
    a("--saturation-lag-ms", type=float, help="generator-saturation threshold (loop lag p99)")
    a("--no-progress", action="store_true", default=None, help="no live progress line")
    g = p.add_argument_group("shared prefixes (workload kind 'prefix'; docs/workloads.md)")
    g.add_argument("--prefix-tokens", type=int, metavar="N", help="tokens of each shared prefix")
    g.add_argument(
        "--prefixes", type=int, metavar="P", help="distinct prefixes (1: a system prompt)"
    )
    g.add_argument("--requests-per-prefix", type=int, metavar="M", help="requests per prefix")
    g.add_argument("--suffix-tokens", type=int, metavar="S", help="unique tokens after the prefix")
    g.add_argument("--prefix-order", choices=["random", "grouped", "round_robin"])
    g.add_argument("--cache-bust", action="store_true", default=None,
                   help="a salt unique to this run in front of every prompt: start cold")  # fmt: skip
    g.add_argument("--cache-block-size", type=int, metavar="B",
                   help="the server's KV block size, for the block-aligned expected hit rate")  # fmt: skip


# flag attribute -> RunConfig field (for the flags that map one to one)
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
    "workers": "workers",
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
    "cache_bust": "cache_bust",
    "cache_block_size": "block_size",
}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The scenario file (if any), then every flag that was given; demo defaults without both."""
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
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--extra-body is not valid JSON: {exc.msg}") from exc
        except RecursionError:
            raise ConfigError(f"--extra-body is {TOO_DEEP}") from None
        if not isinstance(extra, dict):
            raise ConfigError("--extra-body must be a JSON object, e.g. '{\"ignore_eos\": true}'")
        fields["extra_body"] = extra
    prefix = {key: getattr(args, attr) for attr, key in _PREFIX_FLAGS.items()
              if getattr(args, attr, None) is not None}  # fmt: skip
    if prefix:  # over the scenario's prefix workload, else a prefix workload of its own
        base_wl = dict(fields.get("workload") or {})
        fields["workload"] = {**(base_wl if base_wl.get("kind") == "prefix" else {}),
                              "kind": "prefix", **prefix}  # fmt: skip
    if args.redact_header:
        fields["redact_headers"] = tuple(args.redact_header)
    if args.no_stream:
        fields["stream"] = False
    if args.no_progress:
        fields["progress"] = False
    fields["endpoints"] = tuple(_endpoints(args, base_endpoints))
    if not fields["endpoints"] and not args.scenario:
        demo = dict(DEMO_DEFAULTS)
        if "rate_rps" in given:
            demo.pop("concurrency")
        if "duration_s" in given or "requests" in given:  # the user's stop rule alone
            demo.pop("duration_s")
            demo.pop("requests")
        for key, value in demo.items():
            fields.setdefault(key, value)
    _workload_flags(args, fields)
    return RunConfig(**fields)


def _workload_flags(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    """``--tokenizer`` and ``--exact-output`` are workload keys: they win over the scenario's.

    Without either a tokenizer or ``chars_per_token``, prompts are sized exactly all the same:
    ``auto`` against an endpoint (its tokenizer route, else a calibration, else an estimate
    with a warning: ``loadlab.workloads.exact.sizing``), ``byte`` on the embedded reference
    server."""
    workload = dict(fields.get("workload") or {"kind": "synthetic"})
    if args.tokenizer is not None:
        workload.pop("chars_per_token", None)
        workload["tokenizer"] = args.tokenizer
    elif workload.get("tokenizer") is None and workload.get("chars_per_token") is None:
        workload["tokenizer"] = "auto" if fields.get("endpoints") else "byte"
    if args.exact_output:
        workload["exact_output"] = True
    fields["workload"] = workload


def out_paths(cfg: RunConfig, names: list[str]) -> list[Path]:
    """One results file per endpoint: the --out name, or reports/run-<UTC time>.json."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = Path(cfg.out) if cfg.out else Path("reports") / f"run-{stamp}.json"
    if len(names) == 1:
        return [base]
    return [base.with_name(f"{base.stem}-{n}{base.suffix or '.json'}") for n in names]


@contextlib.contextmanager
def _embedded_server() -> Iterator[str]:
    try:
        from reference_server.launch import start_server
    except ImportError as exc:
        raise SystemExit(
            "loadlab run: no --endpoint given and the embedded reference server is not "
            f"available ({exc}). Give --endpoint URL, or install it: pip install -e '.[server]'"
        ) from exc
    print("loadlab run: starting the embedded reference server (CPU preset) ...", file=sys.stderr)
    try:
        # leave a core to loadlab: a server whose torch threads take every core would delay
        # loadlab's own timestamps (the run would be flagged saturated)
        threads = str(max(1, (os.cpu_count() or 2) - 1))
        server_cm = start_server(
            mode="continuous", preset="cpu", port=None, env={"OMP_NUM_THREADS": threads}
        )
        server = server_cm.__enter__()
    except RuntimeError as exc:
        raise SystemExit(
            f"loadlab run: the embedded reference server did not start ({exc}). "
            "Give --endpoint URL to test another server."
        ) from exc
    try:
        yield str(server.url)
    finally:
        server_cm.__exit__(None, None, None)


def summary_text(results: Results) -> str:
    from loadlab.report.text import render_summary

    return render_summary(results)


def warn(text: str) -> None:
    """A loud line on stderr, red on a terminal."""
    if sys.stderr.isatty():
        text = f"\033[1;31m{text}\033[0m"
    print(text, file=sys.stderr)


def _check(cfg: RunConfig) -> None:
    """Bad workload, SLO or scenario input fails here, before any server is started."""
    from loadlab.workloads import validate_workload

    validate_workload(cfg)
    if not cfg.endpoints:
        require("server", "the embedded reference server (no --endpoint)")
    if cfg.scrape:
        import importlib.util

        if importlib.util.find_spec("loadlab.runner.scrape") is None:
            raise ConfigError(
                "--scrape needs loadlab.runner.scrape, which this build does not have"
            )
    if cfg.slo:
        from loadlab.slo import load_slo

        load_slo(cfg.slo)


def run(args: argparse.Namespace) -> int:
    with signals.install():  # SIGTERM and SIGHUP end a run as Ctrl-C does
        cfg = config_from_args(args)
        _check(cfg)  # bad input fails here (exit 2 in cli.main), before any server is started
        if not cfg.endpoints:
            with _embedded_server() as url:
                return _run(cfg.replace(endpoints=(EndpointConfig(url=url, name="reference"),)))
        return _run(cfg)


def _prepare_outputs(cfg: RunConfig, paths: list[Path]) -> list[Path]:
    """Every results path checked (writable, not a folder, room for a first write) and its
    journal started, before any request is sent (``loadlab.journal``)."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    return [
        prepare_output(
            path,
            {"started_at": started_at, "kind": "run", "endpoint": ep.name, "config": cfg.to_dict()},
        )
        for ep, path in zip(cfg.endpoints, paths, strict=True)
    ]


def _write(results: Results, path: Path, journal: Path) -> bool:
    """Write the results file and drop its journal; on failure say where the records are."""
    try:
        write_results(results, path)
    except OSError as exc:
        warn(
            f"loadlab run: could not write {path}: {exc.strerror or exc}. Every record is in the "
            f"journal {journal}: rebuild the results with "
            f"loadlab report --from-journal {journal} --out NEW.json"
        )
        return False
    with contextlib.suppress(OSError):
        journal.unlink()
    return True


def _run(cfg: RunConfig) -> int:
    if cfg.interleave and cfg.workers > 1:
        raise ConfigError("--interleave runs in one process; drop --workers")
    from loadlab.runner.prompt_sizing import prepared_sizing

    names = [ep.name for ep in cfg.endpoints]
    paths = out_paths(cfg, names)
    journals = _prepare_outputs(cfg, paths)
    all_results: list[Results] = []
    try:
        with prepared_sizing(cfg) as notes:  # probes each endpoint's tokenizer once, here
            for note in notes:
                warn(note)
            if cfg.interleave and len(cfg.endpoints) > 1:
                all_results = _interleaved(cfg, journals)
            else:
                for ep, journal in zip(cfg.endpoints, journals, strict=True):
                    if len(cfg.endpoints) > 1:
                        print(f"loadlab run: endpoint {ep.name} ...", file=sys.stderr)
                    results = run_load(
                        cfg, ep, _build_for(ep), progress=cfg.progress, journal=journal
                    )
                    all_results.append(results)
                    if results.extra.get("interrupted"):
                        break
    except UsageError as exc:  # a setting only the client, the workers or the endpoint can check
        if not all_results:
            raise
        warn(f"loadlab run: {exc}; the results of the endpoints before it are written")
    code = 0
    for results, path, journal in zip(all_results, paths, journals, strict=False):
        if not _write(results, path, journal):
            code = max(code, 2)
        if "journal_error" in results.extra:
            warn(f"loadlab run: the journal stopped: {results.extra['journal_error']}")
        print(summary_text(results))
        line = saturation_warning(results.generator)
        if line:
            warn(line)
        line = prompt_warning(prompt_match(results.records))
        if line:
            warn(line)
        print(f"results: {path}")
        code = max(code, _slo_exit(cfg, results))
        if not any(r.ok for r in results.records):
            # a load test in which nothing succeeded must not look green in CI
            warn(f"loadlab run: no request succeeded ({path}): exit code 3")
            code = max(code, 3)
    if len(all_results) > 1:
        print(_comparison(all_results, names, paths[0]))
    for journal in journals[len(all_results) :]:  # endpoints never run: nothing to keep
        with contextlib.suppress(OSError):
            journal.unlink()
    if any(r.extra.get("interrupted") for r in all_results):
        warn("loadlab run: interrupted; the results so far were written")
        return signals.exit_code()
    return code


def _comparison(all_results: list[Results], names: list[str], first: Path) -> str:
    """Side by side against the first endpoint (``loadlab.analysis.compare``), printed and written next
    to the results files as ``<out>.compare.md`` and ``<out>.compare.json``."""
    try:
        from loadlab.analysis.compare import compare  # type: ignore[import-not-found,unused-ignore]
        from loadlab.report.comparison import (  # type: ignore[import-not-found,unused-ignore]
            render_comparison,
            render_comparison_markdown,
        )
    except ImportError:
        return "compare the files with: loadlab compare " + " ".join(names)
    cmp = compare(all_results, names[: len(all_results)])
    stem = first.stem.removesuffix(f"-{names[0]}")
    # ".compare", not "-compare": out-*.json globs the results files only
    md, js = first.with_name(f"{stem}.compare.md"), first.with_name(f"{stem}.compare.json")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(render_comparison_markdown(cmp), encoding="utf-8")
    js.write_text(json.dumps(cmp.to_dict(), indent=2) + "\n", encoding="utf-8")
    return f"{render_comparison(cmp)}comparison: {md} {js}"


def _build_for(ep: EndpointConfig) -> BuildRequests:
    """The run's requests with prompts sized for ``ep``'s tokenizer: a vendor comparison sends
    each endpoint the same requests (ids, lengths, schedule), each of the requested length as
    that endpoint counts it."""
    from loadlab.workloads import build_requests

    def build(cfg: RunConfig) -> Iterator[Any]:
        return build_requests(cfg.replace(endpoints=(ep,)))

    return build


def _interleaved(cfg: RunConfig, journals: list[Path]) -> list[Results]:
    """All endpoints at once, each with the same seeded requests on the same schedule."""
    import asyncio

    from loadlab.runner.runner import run_async

    async def both() -> list[Results]:
        t0 = time.perf_counter_ns() + 50_000_000
        runs = [
            run_endpoint(
                cfg,
                ep,
                _build_for(ep)(cfg),
                t0_ns=t0,
                progress=False,
                scrape=i == 0,
                journal=journals[i],
            )
            for i, ep in enumerate(cfg.endpoints)
        ]
        return list(await asyncio.gather(*runs))

    return run_async(both())


def _slo_exit(cfg: RunConfig, results: Results) -> int:
    if not cfg.slo:
        return 0
    from loadlab.report.text import render_verdict
    from loadlab.slo import evaluate, load_slo

    verdict = evaluate(results, load_slo(cfg.slo))
    print(render_verdict(verdict))
    return int(verdict.exit_code)
