"""Model shapes: exact parameter counts, presets, argument validation, the GPU path."""

from __future__ import annotations

import pytest
import torch

from reference_server.model import PRESETS, ModelArgs, Transformer


@pytest.mark.parametrize(
    "args",
    [
        PRESETS["tiny"],
        ModelArgs(dim=96, n_layers=3, n_heads=6, n_kv_heads=1, ffn_dim=100, vocab_size=333),
    ],
)
def test_num_params_is_exact(args: ModelArgs) -> None:
    model = Transformer(args)  # small shapes on CPU (the meta device imports the compiler)
    assert args.num_params == sum(p.numel() for p in model.parameters())


def test_tiny_by_hand() -> None:
    a = PRESETS["tiny"]  # dim 64, 2 layers, 4 heads of 16, 2 KV heads, ffn 192, vocab 320
    per_layer = 64 * 16 * (4 + 2 * 2) + 64 * 64 + 3 * 64 * 192 + 2 * 64
    assert a.head_dim == 16
    assert a.num_params == 2 * 320 * 64 + 2 * per_layer + 64 == 139_584


def test_cpu_preset_is_bigger_than_l3_and_fits_long_prompts() -> None:
    a = PRESETS["cpu"]  # dim 768, 8 layers, 12 heads of 64, 4 KV heads, ffn 2048
    per_layer = 768 * 64 * (12 + 2 * 4) + 768 * 768 + 3 * 768 * 2048 + 2 * 768
    assert a.num_params == 2 * 320 * 768 + 8 * per_layer + 768 == 50_836_224
    assert a.num_params * 4 > 4 * 32 * 2**20  # fp32 weights several times a 32 MiB L3
    assert a.max_seq_len >= 4096


def test_1b_preset_by_hand() -> None:
    a = PRESETS["1b"]  # Llama-3.2-1B layer shapes: dim 2048, 16 layers, 32/8 heads, ffn 8192
    per_layer = 2048 * 64 * (32 + 2 * 8) + 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048
    assert a.num_params == 2 * 320 * 2048 + 16 * per_layer + 2048 == 974_456_832


def test_bad_args_say_the_fix() -> None:
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=3, ffn_dim=64)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        ModelArgs(dim=65, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_1b_preset_runs_on_gpu_in_bf16() -> None:
    from reference_server.model_runner import ModelRunner
    from reference_server.sequence import ScheduledBatch, ScheduledSeq
    from tests.helpers.model_driver import Driver, dense_forward, prompt_of, seq

    runner = ModelRunner("1b", num_kv_blocks=256)
    assert runner.device.type == "cuda" and runner.dtype == torch.bfloat16
    drv = Driver(runner)
    seqs = [seq(f"g{i}", prompt_of(40 + 13 * i, i)) for i in range(4)]
    drv.step([(s, s.num_prompt_tokens) for s in seqs])
    drv.decode(seqs, 4)
    for s in seqs:
        assert len(s.output_token_ids) == 5 and all(0 <= t < 256 for t in s.output_token_ids)
    # Paged vs dense in bf16: the next-token logits agree closely (greedy ties may differ).
    s = seqs[2]
    while len(s.block_table) * runner.block_size < s.num_tokens:
        s.block_table.append(drv.free.pop())
    _, paged = runner.logits(ScheduledBatch([ScheduledSeq(s, 1)]))
    ref, _ = dense_forward(runner, s.token_ids)
    assert torch.nn.functional.cosine_similarity(paged[0], ref[-1], dim=0) > 0.99


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_prepacked_linear_equals_the_plain_matmul_and_follows_weight_changes() -> None:
    from reference_server.model import Linear

    torch.manual_seed(0)
    lin = Linear(48, 80)
    with torch.no_grad():
        lin.weight.normal_()
    assert lin.prepack()  # CPU fp32: packed
    for rows in (1, 2, 3, 7, 64):
        x = torch.randn(rows, 48)
        torch.testing.assert_close(lin(x), x @ lin.weight, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        lin.weight.mul_(2.0)
    lin.prepack()  # packing is a copy: pack again after changing the weight
    x = torch.randn(5, 48)
    torch.testing.assert_close(lin(x), x @ lin.weight, rtol=1e-4, atol=1e-4)
    assert not Linear(4, 4).to(torch.bfloat16).prepack()  # only fp32 is packed
