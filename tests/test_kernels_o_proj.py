"""A decode step's o_proj fused with the norms after attention (kernels/o_proj_triton.py) against the
two kernels it replaces and the torch path: the same bits, one launch, blocks left apart."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels import backend
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.int4 import quantize_int4
from flashdesk.kernels.launch_log import count_kernels
from flashdesk.kernels.layer_norms import RouterInput, attention_out_norms, o_proj_and_norms
from flashdesk.kernels.linear import linear

pytest.importorskip("triton")


def _inputs(n, k, moe, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = quantize_int4((torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16), 32)
    a = torch.randn(16, k, generator=gen).to(torch.bfloat16)
    residual = (torch.randn(16, n, generator=gen) * 2).to(torch.bfloat16)
    post, pre, experts = (torch.rand(n, generator=gen) + 0.5 for _ in range(3))
    router = RouterInput(experts, (torch.rand(n, generator=gen) + 0.5).to(torch.bfloat16), n**-0.5) if moe else None
    return w, a, residual, (1e-6, post, pre, router)


# a K that splits (its tiles' sums, then the row's chain by the last tile), one that does not;
# with the MoE's four outputs and without
@pytest.mark.parametrize("n, k, moe", [(320, 256, True), (64, 128, False), (2816, 512, True)])
def test_one_kernel_gives_what_the_projection_and_the_norms_give(n, k, moe):
    w, a, residual, norms = _inputs(n, k, moe)
    counters = backend.arrival_counters(torch.device("cpu"))
    with kernels("triton"):
        fused = o_proj_and_norms(a[:1], w, residual[:1], *norms)
        apart = attention_out_norms(linear(a[:1], w), residual[:1], *norms)
        assert len(fused) == (4 if moe else 2) and all(torch.equal(f, p) for f, p in zip(fused, apart))
        assert not counters.any()  # every split tile's and the row's counter back at zero
        with count_kernels() as counts:
            o_proj_and_norms(a[:1], w, residual[:1], *norms)
    assert dict(counts) == {"_o_proj_norms_kernel": 1}
    with kernels("torch"):
        reference = o_proj_and_norms(a[:1], w, residual[:1], *norms)
    for got, want in zip(fused, reference):
        assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()


def test_a_decode_row_equals_the_same_row_of_a_verify_block():
    """Batch invariance across the two paths: a block of 16 rows takes the projection and the
    norms' kernel apart, a single row the fused kernel; each row's bits are the same."""
    w, a, residual, norms = _inputs(320, 256, True, seed=1)
    with kernels("triton"):
        block = o_proj_and_norms(a, w, residual, *norms)
        with count_kernels() as counts:
            o_proj_and_norms(a, w, residual, *norms)
        assert "_o_proj_norms_kernel" not in counts and counts.get("_attention_out_kernel") == 1
        for i in (0, 6, 15):
            alone = o_proj_and_norms(a[i : i + 1], w, residual[i : i + 1], *norms)
            assert all(torch.equal(x[0], y[i]) for x, y in zip(alone, block)), i


def test_a_bf16_projection_or_a_fallen_back_family_takes_the_two_kernels():
    w, a, residual, norms = _inputs(320, 256, True, seed=2)
    with kernels("triton"):
        with count_kernels() as counts:
            o_proj_and_norms(a[:1], w.dequantize(torch.bfloat16), residual[:1], *norms)
        assert "_o_proj_norms_kernel" not in counts and counts.get("_attention_out_kernel") == 1
        backend.fall_back("o_proj_norms", "a test")
        try:
            with count_kernels() as counts:
                o_proj_and_norms(a[:1], w, residual[:1], *norms)
        finally:
            backend.clear_fallbacks()
        assert "_o_proj_norms_kernel" not in counts and counts.get("_attention_out_kernel") == 1
