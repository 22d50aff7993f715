"""Sizing prompts by asking the endpoint: ``server``, ``calibrate`` and ``auto``.

A local tokenizer sizes prompts inside the workload (``loadlab.workloads.exact``). The methods
that ask the endpoint send requests (``loadlab.clients.counting``), which the data layers must
not do, so they are resolved here, once per endpoint, before the requests are built:

    server      the endpoint's counting route (/tokenize, /v1/tokenize, count_tokens), or an error
    calibrate   two one-token requests (``usage.prompt_tokens``: overhead and characters per
                token), or an error
    auto        the reference server's byte tokenizer when ``/v1/server_info`` says so, else
                ``server``, else ``calibrate``, else an estimate of ``FALLBACK_CHARS_PER_TOKEN``
                characters per token with one warning line: auto never stops a run

Example::

    with prepared_sizing(cfg) as warnings:   # probes each of cfg.endpoints once
        for line in warnings:
            print(line, file=sys.stderr)
        specs = build_requests(cfg)          # finds the sizing resolved above
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from loadlab.clients.counting import calibrate, server_counter, server_says_byte
from loadlab.config import EndpointConfig, RunConfig
from loadlab.workloads.exact import (
    AsksServer,
    PromptFitter,
    Sizing,
    forget_sizing,
    local_sizing,
    remember_sizing,
    sizing,
)
from loadlab.workloads.params import WorkloadError
from loadlab.workloads.prompts import prompt_text
from loadlab.workloads.tokenizers import ByteTokens

__all__ = ["FALLBACK_CHARS_PER_TOKEN", "ask_endpoint", "prepared_sizing"]

# ``auto`` with nothing to count with: English text under GPT- and Llama-style BPE vocabularies
FALLBACK_CHARS_PER_TOKEN = 4.0


def _probe_text(chars: int) -> str:
    return prompt_text(chars, np.random.default_rng(0), tag="probe")


def _asking(ep: EndpointConfig, method: str) -> Sizing:
    if method == "auto" and server_says_byte(ep):
        return local_sizing(ByteTokens(), ep.api, "reference server:")
    if method in ("auto", "server"):
        counter = server_counter(ep)
        if counter is not None:
            # two counts give the text's characters per token: the first drafts' length, and
            # a dataset's answer lengths and filters (loadlab.workloads.dataset)
            short, long = (_probe_text(n) for n in (256, 2304))
            grew = counter.count(long) - counter.count(short)
            cpt = (len(long) - len(short)) / grew if grew > 0 else 4.0
            return Sizing(
                f"server {counter.url}",
                cpt,
                lambda: PromptFitter(counter.count, chars_per_token=cpt),
                remote=True,
            )
        if method == "server":
            raise WorkloadError(
                f"endpoint {ep.name}: no /tokenize, /v1/tokenize or count_tokens route answered; "
                "give --tokenizer PATH, or --tokenizer calibrate"
            )
    cal = calibrate(ep, _probe_text)
    return Sizing(
        f"calibrated ({cal.chars_per_token:.2f} chars/token, {cal.overhead_tokens:.0f} overhead)",
        cal.chars_per_token,
        lambda: PromptFitter(
            lambda t: round(cal.overhead_tokens + len(t) / cal.chars_per_token),
            chars_per_token=cal.chars_per_token,
        ),
    )


def ask_endpoint(ep: EndpointConfig, method: str) -> Sizing:
    """Resolve ``method`` against ``ep`` (module docstring). ``server`` and ``calibrate`` raise
    ``WorkloadError`` when they cannot work; ``auto`` falls back to an estimate instead."""
    if method != "auto":
        return _asking(ep, method)
    try:
        return _asking(ep, method)
    except (WorkloadError, OSError, ValueError) as exc:  # auto must not stop a run
        why = f"no tokenizer route, and calibration failed: {exc}"
        return Sizing(
            f"estimate ({FALLBACK_CHARS_PER_TOKEN:g} chars/token)",
            FALLBACK_CHARS_PER_TOKEN,
            None,
            warning=(
                f"loadlab run: endpoint {ep.name}: prompt lengths are estimates at "
                f"{FALLBACK_CHARS_PER_TOKEN:g} characters per token ({why}); for exact lengths "
                "give --tokenizer (the model's tokenizer folder or tokenizer.json)"
            ),
        )


@contextlib.contextmanager
def prepared_sizing(cfg: RunConfig) -> Iterator[list[str]]:
    """Resolve every endpoint's sizing once, before the run; yields the warnings to print.
    Inside, ``build_requests`` finds them; on exit those resolved here are forgotten, so a
    later run against a new server on the same address asks again. Nested calls reuse what an
    outer one resolved."""
    spec = cfg.workload.get("tokenizer")
    warnings: list[str] = []
    added = []
    if spec is not None and spec != "none":
        spec = str(spec)
        for ep in cfg.endpoints:
            try:
                how = sizing(cfg.replace(endpoints=(ep,)), spec)
            except AsksServer as need:
                how = ask_endpoint(ep, need.method)
                added.append(remember_sizing(spec, ep, how))
            if how.warning:
                warnings.append(how.warning)
    try:
        yield warnings
    finally:
        for key in added:
            forget_sizing(key)
