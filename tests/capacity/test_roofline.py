"""Hand-checked roofline figures for Llama-3-8B on H100 and H200 (arithmetic in comments)."""

from __future__ import annotations

import pytest

from loadlab._capacity import roofline
from loadlab._capacity.hardware import get_hardware
from loadlab._capacity.models import get_model
from loadlab.errors import ConfigError

# Llama-3-8B (config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128,
# FFN 14336, vocab 128256), per layer:
#   wq 4096*4096 = 16,777,216; wk + wv 2*4096*1024 = 8,388,608; wo 16,777,216
#   FFN 3*4096*14336 = 176,160,768; two norms 8,192      -> 218,112,000
#   32 layers = 6,979,584,000; output head 128256*4096 = 525,336,576; final norm 4,096
#   matmul params = 7,504,924,672; + embedding 525,336,576 = 8,030,261,248 (published 8.03 B)
MATMUL_PARAMS = 7_504_924_672
WEIGHT_BYTES_READ = 2 * MATMUL_PARAMS  # bf16: 15,009,849,344 bytes per forward pass


def test_llama3_8b_shapes() -> None:
    m = get_model("llama-3-8b")
    assert m.num_params == 8_030_261_248
    assert m.matmul_params == MATMUL_PARAMS
    assert m.weight_bytes_read_per_step == WEIGHT_BYTES_READ
    # 2 (K and V) * 32 layers * 8 KV heads * 128 head dim * 2 bytes (bf16)
    assert m.kv_bytes_per_token == 131_072


def test_other_presets_match_published_sizes() -> None:
    assert round(get_model("llama-3-70b").num_params / 1e9, 1) == 70.6
    assert round(get_model("llama-3.2-1b").num_params / 1e9, 2) == 1.24  # tied embeddings
    assert get_model("llama-3-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # 327,680


@pytest.mark.parametrize(
    ("hw_name", "batch", "context", "expected_ms"),
    [
        # batch 1, no context: 15,009,849,344 B / 3.35e12 B/s = 4.4805 ms
        ("h100", 1, 0, 4.4805),
        # batch 64, 1024 tokens each: KV 64*1024*131,072 = 8,589,934,592 B;
        # (15,009,849,344 + 8,589,934,592) / 3.35e12 = 7.0447 ms
        ("h100", 64, 1024, 7.0447),
        # H200, 4.8 TB/s: 15,009,849,344 / 4.8e12 = 3.1271 ms
        ("h200", 1, 0, 3.1271),
        # 23,599,783,936 / 4.8e12 = 4.9166 ms
        ("h200", 64, 1024, 4.9166),
    ],
)
def test_decode_step_at_peak(hw_name: str, batch: int, context: int, expected_ms: float) -> None:
    hw = get_hardware(hw_name).derated(compute=1.0, bandwidth=1.0)
    e = roofline.decode_step(get_model("llama-3-8b"), hw, batch, context)
    assert e.bound == "memory"
    assert e.time_s * 1e3 == pytest.approx(expected_ms, abs=1e-4)


def test_decode_compute_floor_batch_64() -> None:
    # per sequence 2*7,504,924,672 FLOPs of matmuls + attention 4*32 layers*4096*1025 pairs
    # = 15,009,849,344 + 537,395,200 = 15,547,244,544; x64 = 995,023,650,816 FLOPs;
    # / 989.4e12 = 1.0057 ms < 7.04 ms memory time: decode stays memory-bound at batch 64.
    hw = get_hardware("h100").derated(compute=1.0, bandwidth=1.0)
    e = roofline.decode_step(get_model("llama-3-8b"), hw, 64, 1024)
    assert e.flops == 995_023_650_816
    assert e.compute_s * 1e3 == pytest.approx(1.0057, abs=1e-4)


def test_default_efficiency_scales_time() -> None:
    # default achievable bandwidth is 80 % of peak: 4.4805 ms / 0.8 = 5.6007 ms
    e = roofline.decode_step(get_model("llama-3-8b"), get_hardware("h100"), 1, 0)
    assert e.time_s * 1e3 == pytest.approx(5.6007, abs=1e-4)


def test_prefill_is_compute_bound_for_long_prompts() -> None:
    # 2048 tokens: 2*7,504,924,672*2048 = 30,740,171,456,512 FLOPs of matmuls; attention
    # 4*32*4096*(2048*2049/2) = 1,100,048,498,688; total 31,840,219,955,200
    # / 989.4e12 = 32.181 ms (memory: ~15.3 GB / 3.35e12 = 4.6 ms)
    hw = get_hardware("h100").derated(compute=1.0, bandwidth=1.0)
    e = roofline.prefill(get_model("llama-3-8b"), hw, 2048)
    assert e.flops == 31_840_219_955_200
    assert e.bound == "compute"
    assert e.time_s * 1e3 == pytest.approx(32.181, abs=1e-3)


def test_max_concurrency_and_littles_law() -> None:
    m, hw = get_model("llama-3-8b"), get_hardware("h100")
    # 80e9 * 0.9 - 16,060,522,496 weight bytes = 55,939,477,504 B for KV;
    # 2,000 tokens * 131,072 = 262,144,000 B per request -> 213.4 -> 213
    assert roofline.max_concurrency(m, hw, 2000) == 213
    assert roofline.concurrency_needed(10.0, 2.5) == 25.0


def test_tensor_parallel_for_70b() -> None:
    # 141 GB of bf16 weights: 2 x H100 (144 GB usable) cannot hold them with room for KV;
    # 4 x H100 (288 GB usable) keep them under half.
    m = get_model("llama-3-70b")
    assert roofline.gpus_per_replica(m, get_hardware("h100"), 1250) == 4
    assert roofline.gpus_per_replica(get_model("llama-3-8b"), get_hardware("h100"), 1250) == 1


def test_bad_inputs_say_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        get_model("llama-9")
    with pytest.raises(ValueError, match="fraction"):
        get_hardware("h100").derated(compute=1.5)
    with pytest.raises(ValueError, match="unknown hardware"):
        get_hardware("tpu")


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    # 2048-token prompt, first 1024 cached: matmuls for 1024 tokens, 2*7,504,924,672*1024 =
    # 15,370,085,728,256; attention pairs 1024*1024 + 1024*1025/2 = 1,573,376, times
    # 4*32*4096 = 824,902,156,288; total 16,194,987,884,544 (vs 31,840,219,955,200 uncached)
    m, hw = get_model("llama-3-8b"), get_hardware("h100")
    assert roofline.prefill_flops(m, 2048, cached_tokens=1024) == 16_194_987_884_544
    assert (
        roofline.prefill(m, hw, 2048, cached_tokens=1024).time_s
        < roofline.prefill(m, hw, 2048).time_s / 1.9
    )
    with pytest.raises(ConfigError, match="cached tokens must be in"):
        roofline.prefill_flops(m, 2048, cached_tokens=2048)
