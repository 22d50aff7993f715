"""How a run sizes each endpoint's prompts: ``size_prompts(cfg, endpoint)``, from the run's
``tokenizer``, once per endpoint before any request is built; the ``Sizing`` is handed to
``build_requests``.

A tokenizer loadlab holds counts locally (``loadlab.workloads._exact``). The methods that ask
the endpoint send requests (``loadlab.clients._counting``), which the data layers must not do,
so they are resolved here:

    server      the endpoint's counting route (/tokenize, /v1/tokenize, count_tokens), or an error
    calibrate   two one-token requests (``usage.prompt_tokens``: overhead and characters per
                token), or an error
    auto        the reference server's byte tokenizer when ``/v1/server_info`` says so, else
                ``server``, else ``calibrate``, else an estimate of ``FALLBACK_CHARS_PER_TOKEN``
                characters per token with one warning line: auto never stops a run

Example::

    how = size_prompts(cfg, endpoint)        # asks the endpoint once, if it has to
    if how is not None and how.warning:
        print(how.warning, file=sys.stderr)
    specs = build_requests(cfg.replace(endpoints=(endpoint,)), how)
"""

from __future__ import annotations

import numpy as np

from loadlab.clients._counting import calibrate, server_counter, server_says_byte
from loadlab.config import EndpointConfig, RunConfig
from loadlab.workloads._exact import PromptFitter, Sizing, local_sizing, tokenizer_sizing
from loadlab.workloads._params import WorkloadError
from loadlab.workloads._prompts import prompt_text
from loadlab.workloads._tokenizers import SERVER_METHODS, ByteTokens

__all__ = ["FALLBACK_CHARS_PER_TOKEN", "ask_endpoint", "size_prompts"]

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
            # a dataset's answer lengths and filters (loadlab.workloads._dataset)
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
                f"endpoint {ep.name}: prompt lengths are estimates at "
                f"{FALLBACK_CHARS_PER_TOKEN:g} characters per token ({why}); for exact lengths "
                "give --tokenizer (the model's tokenizer folder or tokenizer.json)"
            ),
        )


def size_prompts(cfg: RunConfig, endpoint: EndpointConfig) -> Sizing | None:
    """How ``endpoint``'s prompts are sized in this run, from ``cfg.tokenizer``: made once per
    endpoint before any request is built and passed to whatever builds them (``--workers``
    processes get it from the parent). None: prompts are drafts (``tokenizer = "none"``, or a
    workload that gives its own ``chars_per_token`` estimate). May ask the endpoint
    (``server``, ``calibrate``, ``auto``, or a local tokenizer without the chat template a chat
    API needs), so never from inside a running load."""
    spec = cfg.tokenizer
    if spec == "none" or cfg.workload.get("chars_per_token") is not None:
        return None
    if spec not in SERVER_METHODS:
        local = tokenizer_sizing(spec, endpoint.api)
        if local is not None:
            return local
        spec = "auto"  # no chat template: only the endpoint can count its chat prompts
    return ask_endpoint(endpoint, spec)
