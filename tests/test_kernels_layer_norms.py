"""The fused norm chains between a Gemma 4 layer's blocks (kernels/layer_norms.py): the Triton
kernel against the chain of torch ops it replaces, rounded where those ops round, each row the
same alone as among sixteen, and one kernel each."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels import layer_norms as ln
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.router import ordered_sum

pytest.importorskip("triton")

EPS = 1e-6


def _rows(d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _weights(d, seed, n):
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(d, generator=gen) + 0.5 for _ in range(n)]  # fp32, as the model keeps norm weights


def _compare(fused, unfused, reference, dtype, chain):
    """Against the torch ops to float rounding (their sums of squares add in another order, so a
    bf16 may round the other way), and against the same chain of unfused Triton norms bit for bit
    in bf16: every step rounds where those round."""
    for name, got, plain, want in zip(chain, fused, unfused, reference):
        assert got.shape == want.shape and got.dtype == dtype, name
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 4e-2}
        torch.testing.assert_close(got.float(), want.float(), **tol, msg=name)
        if dtype == torch.bfloat16:
            assert torch.equal(got, plain), name


def _check_rows(call, inputs, chain):
    """Rows of a 16-row call equal the same rows computed alone, bit for bit; one kernel a call."""
    from flashdesk.kernels.launch_log import count_kernels

    with kernels("triton"):
        full = call(*inputs)
        for r in (0, 7, 15):
            alone = call(*(x[r : r + 1] for x in inputs))
            for name, a, f in zip(chain, alone, full):
                assert torch.equal(a[0], f[r]), (name, r)
        with count_kernels() as counts:
            call(*inputs)
    assert sum(counts.values()) == 1, dict(counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 2816])
@pytest.mark.parametrize("with_moe", [True, False], ids=["moe", "dense"])
def test_the_norms_after_attention_are_one_kernel(dtype, d, with_moe):
    rand = _rows(d, dtype, seed=d)
    post, pre, experts = _weights(d, 1, 3)
    moe = ln.RouterInput(experts, (torch.rand(d) + 0.5).to(dtype), d**-0.5) if with_moe else None
    a, residual = rand(16, d, scale=3.0), rand(16, d)
    chain = ("h", "x", "experts_x", "router_x") if with_moe else ("h", "x")
    with kernels("triton"):
        fused = ln.attention_out_norms(a, residual, EPS, post, pre, moe)
        unfused = ln.attention_out_reference(a, residual, EPS, post, pre, moe)
    with kernels("torch"):
        reference = ln.attention_out_norms(a, residual, EPS, post, pre, moe)
    assert len(fused) == len(chain)
    _compare(fused, unfused, reference, dtype, chain)
    _check_rows(lambda a, r: ln.attention_out_norms(a, r, EPS, post, pre, moe), (a, residual), chain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 2816])
@pytest.mark.parametrize("experts_out", ["summed", "pairs", None], ids=["moe", "moe-pairs", "dense"])
def test_the_norms_after_the_mlps_are_one_kernel(dtype, d, experts_out):
    """With the experts' output as each token's 8 weighted pair outputs (fp32, what the fused MoE
    hands over unsummed), the kernel sums them in top-k order first: the same bits as the sum."""
    with_moe = experts_out is not None
    rand = _rows(d, dtype, seed=d + 1)
    dense_w, experts_w, out_w, next_w = _weights(d, 2, 4)
    w = ln.MlpOutWeights(
        dense_w if with_moe else None, experts_w if with_moe else None, out_w, torch.tensor([0.37]).to(dtype), next_w
    )
    dense, experts, residual = rand(16, d, scale=2.0), rand(16, d, scale=5.0), rand(16, d)
    experts = experts if with_moe else None
    if experts_out == "pairs":
        pairs = torch.randn(16, 8, d, generator=torch.Generator().manual_seed(d)) * 0.6
        experts = pairs
        with kernels("triton"):
            as_sum = ln.mlp_out_norms(dense, ordered_sum(pairs.movedim(1, -1)).to(dtype), residual, EPS, w)
            for got, want in zip(ln.mlp_out_norms(dense, pairs, residual, EPS, w), as_sum):
                assert torch.equal(got, want)
    with kernels("triton"):
        fused = ln.mlp_out_norms(dense, experts, residual, EPS, w)
        unfused = ln.mlp_out_reference(dense, experts, residual, EPS, w)
    with kernels("torch"):
        reference = ln.mlp_out_norms(dense, experts, residual, EPS, w)
    _compare(fused, unfused, reference, dtype, ("h", "next_x"))
    inputs = (dense, residual) + ((experts,) if with_moe else ())
    _check_rows(lambda d_, r, *e: ln.mlp_out_norms(d_, e[0] if e else None, r, EPS, w), inputs, ("h", "next_x"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_dense_mlps_chunk_partials_sum_in_order_to_its_output(dtype):
    """The dense MLP's output as the expert kernels' per-chunk fp32 partials [S, T, D]: the kernel
    and the reference sum them in chunk order and round, the same bits as the rounded sum given."""
    d = 64
    rand = _rows(d, dtype, seed=3)
    dense_w, experts_w, out_w, next_w = _weights(d, 2, 4)
    w = ln.MlpOutWeights(dense_w, experts_w, out_w, torch.tensor([0.37]).to(dtype), next_w)
    experts, residual = rand(5, d, scale=5.0), rand(5, d)
    partials = torch.randn(3, 5, d, generator=torch.Generator().manual_seed(9)) * 0.7
    summed = ordered_sum(partials.movedim(0, -1)).to(dtype)
    for choice in ("triton", "torch"):
        with kernels(choice):
            for got, want in zip(
                ln.mlp_out_norms(partials, experts, residual, EPS, w),
                ln.mlp_out_norms(summed, experts, residual, EPS, w),
            ):
                assert torch.equal(got, want), choice
    with kernels("triton"), pytest.raises(ValueError, match="dense partials must be fp32"):
        ln.mlp_out_norms(partials.to(dtype) if dtype != torch.float32 else partials[:, :4], experts, residual, EPS, w)


def test_the_chains_compute_what_the_layer_defines():
    """The references spelled out op by op as docs/model.md (one decoder layer) defines the layer, in fp32:
    a wrong weight or a missing residual here would pass the fused-against-reference tests."""
    d = 32
    rand = _rows(d, torch.float32, seed=9)
    post, pre, experts, dense_w, experts_w, out_w, next_w = _weights(d, 3, 7)
    scale, scalar = torch.rand(d) + 0.5, torch.tensor([0.5])

    def norm(x, w=None):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return y if w is None else y * w

    a, residual = rand(3, d), rand(3, d)
    h, x, ex, rx = ln.attention_out_reference(a, residual, EPS, post, pre, ln.RouterInput(experts, scale, 0.25))
    torch.testing.assert_close(h, residual + norm(a, post))
    torch.testing.assert_close(x, norm(h, pre))
    torch.testing.assert_close(ex, norm(h, experts))
    torch.testing.assert_close(rx, norm(h) * scale * 0.25)
    dense, moe_out = rand(3, d), rand(3, d)
    out, next_x = ln.mlp_out_reference(
        dense, moe_out, residual, EPS, ln.MlpOutWeights(dense_w, experts_w, out_w, scalar, next_w)
    )
    torch.testing.assert_close(out, (residual + norm(norm(dense, dense_w) + norm(moe_out, experts_w), out_w)) * scalar)
    torch.testing.assert_close(next_x, norm(out, next_w))


def test_rows_must_be_two_dimensional():
    from flashdesk.kernels.layer_norms_triton import attention_out_triton

    x = torch.zeros(2, 3, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match=r"rows \[T, D\]"):
        attention_out_triton(x, x, EPS, w, w, None)
