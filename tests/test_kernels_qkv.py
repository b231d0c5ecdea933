"""The fused q/k/v projection with its head norms, RoPE and K/V store (kernels/qkv_triton.py) against
the two kernels it replaces and against the torch path: the same q and cache bytes, one launch."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels import backend
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.int4 import quantize_int4
from flashdesk.kernels.kv_write import FP8, KVSlots
from flashdesk.kernels.launch_log import count_kernels
from flashdesk.kernels.linear import linear
from flashdesk.kernels.norm import qkv_norms
from flashdesk.kernels.qkv import attention_inputs

pytest.importorskip("triton")


def _layer(heads, kv_heads, d, k_eq_v, hidden, seed=1):
    gen = torch.Generator().manual_seed(seed)
    n = (heads + kv_heads * (1 if k_eq_v else 2)) * d
    weight = quantize_int4((torch.randn(n, hidden, generator=gen) * 0.05).to(torch.bfloat16), 32)
    x = torch.randn(16, hidden, generator=gen).to(torch.bfloat16)
    q_w, k_w = (torch.rand(d, generator=gen) + 0.5 for _ in range(2))
    angles = torch.arange(7, 23)[:, None] * torch.rand(d // 2, generator=gen)[None, :]
    cos, sin = (f(torch.cat([angles, angles], -1)).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    return weight, x, q_w, k_w, cos, sin


def _cache(kv_heads, d, fp8, capacity=24, start=21):
    """A ring whose block wraps (slots 21, 22, 23, 0, ...)."""
    if fp8:
        k, v = (torch.zeros(capacity, kv_heads, d, dtype=FP8) for _ in range(2))
        return KVSlots(
            k,
            v,
            torch.zeros(capacity, kv_heads),
            torch.zeros(capacity, kv_heads),
            torch.tensor([start], dtype=torch.int32),
            capacity,
        )
    k, v = (torch.zeros(capacity, kv_heads, d, dtype=torch.bfloat16) for _ in range(2))
    return KVSlots(k, v, None, None, torch.tensor([start], dtype=torch.int32), capacity)


def _state(q, into):
    return [q] + [t.view(torch.uint8) if t.dtype == FP8 else t for t in into[:4] if t is not None]


# head dims below, at and above the projection's 64-column tile; v its own or k's; a K wide enough
# to split (the split tiles' sum, then the head groups, each by its last arrival)
SHAPES = [(4, 2, 16, False, 320), (4, 1, 64, True, 320), (2, 1, 128, False, 512), (4, 2, 32, True, 2816)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[0]}_KVH{s[1]}_D{s[2]}_{'keqv' if s[3] else 'v'}_K{s[4]}")
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
def test_one_kernel_stores_what_the_projection_and_the_head_norms_store(shape, fp8):
    """A decode step's row: one launch, the same q and cache bytes as the two kernels; a block of
    5 or 16 rows (which would run its rows one after another in the fused tail) takes the two."""
    heads, kv_heads, d, k_eq_v, hidden = shape
    weight, x, q_w, k_w, cos, sin = _layer(*shape)
    counters = backend.arrival_counters(torch.device("cpu"))
    with kernels("triton"):
        for rows in (1, 5, 16):
            a = (q_w, k_w, cos[:rows], sin[:rows], 1e-6, heads, kv_heads, d, k_eq_v)
            fused, apart = _cache(kv_heads, d, fp8), _cache(kv_heads, d, fp8)
            q = attention_inputs(x[:rows], weight, *a, into=fused)[0]
            q_apart = qkv_norms(linear(x[:rows], weight), *a, into=apart)[0]
            assert all(torch.equal(g, w) for g, w in zip(_state(q, fused), _state(q_apart, apart))), rows
            assert not counters.any()  # every split tile's and head group's counter back at zero
            into = _cache(kv_heads, d, fp8)
            with count_kernels() as counts:
                attention_inputs(x[:rows], weight, *a, into=into)
            if rows == 1:
                assert dict(counts) == {"_qkv_heads_kernel": 1}
            else:
                assert "_qkv_heads_kernel" not in counts and counts.get("_head_norms_kernel") == 1, dict(counts)


def test_rows_are_the_same_alone_and_in_a_block_and_close_to_the_torch_path():
    """Batch invariance across the two paths (a verify block, projection and head norms apart,
    stores what the same tokens one by one store through the fused kernel), and the torch path
    (int4 dequantized, torch norms and RoPE, kv_write's definition) within bf16 rounding."""
    heads, kv_heads, d, k_eq_v, hidden = 4, 2, 64, False, 320
    weight, x, q_w, k_w, cos, sin = _layer(heads, kv_heads, d, k_eq_v, hidden, seed=3)

    def run(path, rows):
        into = _cache(kv_heads, d, False, start=21 + rows.start)
        with kernels(path):
            q = attention_inputs(
                x[rows], weight, q_w, k_w, cos[rows], sin[rows], 1e-6, heads, kv_heads, d, k_eq_v, into
            )[0]
        slots = (torch.arange(rows.start, rows.stop) + 21) % 24
        return q, into.k[slots], into.v[slots]

    block = run("triton", slice(0, 16))
    for i in (0, 7, 15):
        alone = run("triton", slice(i, i + 1))
        assert all(torch.equal(a[0], b[i]) for a, b in zip(alone, block)), i
    for got, want in zip(block, run("torch", slice(0, 16))):
        assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()
        assert got.float().abs().max() > 0  # written


def test_what_does_not_fit_takes_the_two_kernels():
    """A bf16 projection, no cache to store into, or the family fallen back: the projection and the
    head norms apart."""
    heads, kv_heads, d, k_eq_v, hidden = 4, 2, 16, False, 320
    weight, x, q_w, k_w, cos, sin = _layer(heads, kv_heads, d, k_eq_v, hidden)
    cases = {
        "bf16 weight": (x[:1], weight.dequantize(torch.bfloat16), 1, True),
        "no cache": (x[:1], weight, 1, False),
    }
    with kernels("triton"):
        for name, (rows_x, w, rows, store) in cases.items():
            into = _cache(kv_heads, d, False, capacity=32) if store else None
            with count_kernels() as counts:
                attention_inputs(rows_x, w, q_w, k_w, cos[:rows], sin[:rows], 1e-6, heads, kv_heads, d, k_eq_v, into)
            assert "_qkv_heads_kernel" not in counts and counts.get("_head_norms_kernel") == 1, (name, dict(counts))
        backend.fall_back("qkv_heads", "a test")
        try:
            with count_kernels() as counts:
                attention_inputs(
                    x[:1],
                    weight,
                    q_w,
                    k_w,
                    cos[:1],
                    sin[:1],
                    1e-6,
                    heads,
                    kv_heads,
                    d,
                    k_eq_v,
                    _cache(kv_heads, d, False),
                )
        finally:
            backend.clear_fallbacks()
        assert "_qkv_heads_kernel" not in counts and counts.get("_linear_kernel") == 1, dict(counts)
