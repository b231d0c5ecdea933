"""The plain-torch kernels: their fast paths compute the same function as the definitions."""

import torch

from flashdesk.kernels.attention import attention_reference
from flashdesk.kernels.moe import moe_every_expert, moe_gathered, moe_reference


def _random_moe(seed: int, t: int, e: int = 8, d: int = 32, i: int = 24, k: int = 3):
    """x, gate_up, down, top_idx, top_w of a random MoE call with t tokens."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=gen)
    gate_up, down = torch.randn(e, 2 * i, d, generator=gen), torch.randn(e, d, i, generator=gen)
    idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    return x, gate_up, down, idx, torch.rand(t, k, generator=gen)


def test_gathered_moe_equals_the_per_expert_loop():
    x, gate_up, down, idx, w = _random_moe(0, t=13)
    assert torch.allclose(
        moe_gathered(x, gate_up, down, idx, w), moe_reference(x, gate_up, down, idx, w), atol=1e-4, rtol=1e-5
    )


def test_every_expert_moe_equals_the_per_expert_loop_and_is_batch_invariant_in_bf16():
    t = 16
    x, gate_up, down, idx, w = _random_moe(2, t)
    assert torch.allclose(
        moe_every_expert(x, gate_up, down, idx, w), moe_reference(x, gate_up, down, idx, w), atol=1e-4, rtol=1e-5
    )
    xb, gate_up_b, down_b = x.bfloat16(), gate_up.bfloat16(), down.bfloat16()
    block = moe_every_expert(xb, gate_up_b, down_b, idx, w)
    for row in range(t):  # a verify block's row is what the same token computes alone
        alone = moe_every_expert(xb[row : row + 1], gate_up_b, down_b, idx[row : row + 1], w[row : row + 1])
        assert torch.equal(block[row], alone[0])


def test_attention_masks_by_position():
    """Causal + window: a query sees exactly the keys in (p - W, p]; non-causal full sees all."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(3, 2, 8, generator=gen),
        torch.randn(10, 1, 8, generator=gen),
        torch.randn(10, 1, 8, generator=gen),
    )
    q_pos, k_pos = torch.tensor([7, 8, 9]), torch.arange(10)
    out = attention_reference(q, k, v, q_pos, k_pos, window=3, scale=0.5)
    for row, p in enumerate(q_pos.tolist()):
        keys = [j for j in range(10) if p - 3 < j <= p]
        probs = torch.softmax((q[row] @ k[keys, 0].T) * 0.5, dim=-1)
        assert torch.allclose(out[row], probs @ v[keys, 0], atol=1e-5)
    full = attention_reference(q, k, v, q_pos, k_pos, window=None, scale=0.5, causal=False)
    probs = torch.softmax((q[0] @ k[:, 0].T) * 0.5, dim=-1)
    assert torch.allclose(full[0], probs @ v[:, 0], atol=1e-5)


def test_rows_from_slices_every_weight_format_without_copying():
    """The drafter's context reads the k/v rows of its fused qkv projection: a dense weight, an int4
    one, or a tuple of parts that could not be concatenated, sliced as views."""
    from flashdesk.kernels.int4 import quantize_int4
    from flashdesk.kernels.linear import concat_rows, linear, rows_from

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 64, generator=gen) for n in (48, 16, 16))
    x = torch.randn(5, 64, generator=gen)
    for parts in (
        [q, k, v],
        [quantize_int4(q, 32), quantize_int4(k, 32), quantize_int4(v, 32)],
        [q, quantize_int4(k, 32), quantize_int4(v, 32)],
        [quantize_int4(q, 32), k, v],
    ):
        fused = concat_rows(parts)
        tail = rows_from(fused, 48)
        want = torch.cat([linear(x, k_or_v) for k_or_v in parts[1:]], dim=-1)
        torch.testing.assert_close(linear(x, tail), want)  # (torch may block a narrower matmul differently)
        torch.testing.assert_close(linear(x, rows_from(fused, 56)), want[:, 8:])
    assert rows_from(q, 40).data_ptr() == q[40:].data_ptr()
