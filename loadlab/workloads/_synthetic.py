"""Synthetic workload: independent requests with fixed or drawn lengths, sent by the arrival
process (open loop) or as fast as the concurrency allows (closed loop).

``[workload]`` keys (kind = "synthetic")::

    prompt_tokens      number or distribution (default: the run's prompt_tokens)
    output_tokens      number or distribution (default: the run's max_tokens)
    request_class      label for per-class SLOs (default "synthetic"; e.g. "long_prompt")
    max_prompt_tokens, max_output_tokens   clamps applied to every drawn length
    exact_output       ask servers that support it for exactly max_tokens (ignore_eos)
    images             images with each request (``loadlab.workloads._images``): a table
    audio              audio clips with each request (``loadlab.workloads._audio``): a table

Example::

    cfg = RunConfig(rate_rps=2, requests=3, workload={"kind": "synthetic", "prompt_tokens": 50})
    [s.intended_at_s for s in synthetic_requests(cfg)]   # Poisson offsets from the run seed
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._audio import AudioMaker, check_audio_apis
from loadlab.workloads._base import (
    COMMON_KEYS,
    RequestStream,
    check_common,
    independent_requests,
    int_stream,
    length_dists,
    open_loop_times,
    rng_for,
)
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._images import ImageMaker, check_image_apis
from loadlab.workloads._params import check_keys

__all__ = ["KEYS", "synthetic_requests", "validate"]

KEYS = COMMON_KEYS | {"prompt_tokens", "output_tokens", "images", "audio"}


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> None:
    check_keys("synthetic", params, KEYS)
    length_dists(params, cfg.prompt_tokens, cfg.max_tokens, bases)
    check_common(params, bases)
    if "images" in params:
        ImageMaker.of(params["images"], cfg.request_seed, bases)
        check_image_apis(cfg)
    if "audio" in params:
        AudioMaker.of(params["audio"], cfg.request_seed, bases)
        check_audio_apis(cfg)


def synthetic_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    validate(cfg, params)
    prompt_dist, output_dist = length_dists(params, cfg.prompt_tokens, cfg.max_tokens, ())
    times = open_loop_times(cfg, cfg.requests)
    n = len(times) if times is not None else cfg.requests

    def specs() -> Iterator[RequestSpec]:
        seed = cfg.request_seed
        prompts = int_stream(prompt_dist, rng_for(seed, "prompt"))
        outputs = int_stream(output_dist, rng_for(seed, "output"))
        specs = independent_requests(
            cfg, "synthetic", "syn", prompts, outputs, times, n=n, chars_per_token=chars_per_token
        )
        if "images" in params:
            specs = _with_images(specs, ImageMaker.of(params["images"], seed), seed)
        if "audio" in params:
            specs = _with_audio(specs, AudioMaker.of(params["audio"], seed), seed)
        yield from specs

    return RequestStream(specs(), lambda: {"kind": "synthetic", "requests": n})


def _with_images(
    specs: Iterator[RequestSpec], maker: ImageMaker, seed: int
) -> Iterator[RequestSpec]:
    rng = rng_for(seed, "images")
    for spec in specs:
        urls, sizes = maker.draw(rng)
        yield dataclasses.replace(
            spec, images=urls, image_sizes=sizes, image_tokens=maker.tokens(sizes)
        )


def _with_audio(
    specs: Iterator[RequestSpec], maker: AudioMaker, seed: int
) -> Iterator[RequestSpec]:
    rng = rng_for(seed, "audio")
    for spec in specs:
        clips, seconds, tokens = maker.draw(rng)
        yield dataclasses.replace(spec, audio=clips, audio_s=seconds, audio_tokens=tokens)
