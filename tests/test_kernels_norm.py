"""The Triton RMSNorm against the torch definition, and its rows independent of the row count."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flashdesk.kernels.backend import CompileSpec, kernels  # noqa: E402
from flashdesk.kernels.norm import rms_norm, rms_norm_reference  # noqa: E402

pytest.importorskip("triton")


@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 16), (2, 40)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_matches_the_definition(shape, with_weight):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen) * 3
    w = torch.randn(shape[-1], generator=gen) if with_weight else None
    with kernels("triton"):
        got = rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, rms_norm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_bf16_rows_round_like_the_definition():
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with kernels("triton"):
        got = rms_norm(x, None, 1e-6)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rms_norm_reference(x, None, 1e-6).float(), rtol=1e-2, atol=1e-2)


def test_a_row_is_the_same_alone_and_among_sixteen():
    x = torch.randn(16, 2, 48, generator=torch.Generator().manual_seed(2))
    w = torch.rand(48, generator=torch.Generator().manual_seed(3))
    with kernels("triton"):
        block = rms_norm(x, w, 1e-6)
        for r in (0, 7, 15):
            assert torch.equal(rms_norm(x[r:r + 1], w, 1e-6)[0], block[r])


def test_compile_specs_name_every_argument():
    from flashdesk.kernels.norm_triton import compile_specs

    for spec in compile_specs():
        assert isinstance(spec, CompileSpec)
        assert list(spec.signature) == spec.fn.arg_names
        assert set(spec.constexprs) == {n for n, t in spec.signature.items() if t == "constexpr"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_fused_with_the_residual_add_and_the_layer_scalar(dtype):
    gen = torch.Generator().manual_seed(4)
    x, residual = (torch.randn(6, 96, generator=gen) * 3).to(dtype), torch.randn(6, 96, generator=gen).to(dtype)
    w, scale = torch.rand(96, generator=gen) + 0.5, torch.tensor([0.75]).to(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    with kernels("triton"):
        added = rms_norm(x, w, 1e-6, residual=residual)
        scaled = rms_norm(x, w, 1e-6, residual=residual, scale=scale)
        alone = [rms_norm(x[r:r + 1], w, 1e-6, residual=residual[r:r + 1], scale=scale) for r in range(6)]
    torch.testing.assert_close(added.float(), (residual + rms_norm_reference(x, w, 1e-6)).float(), **tol)
    torch.testing.assert_close(scaled.float(), ((residual + rms_norm_reference(x, w, 1e-6)) * scale).float(), **tol)
    assert torch.equal(torch.cat(alone), scaled)  # rows do not depend on the row count
    # it rounds where the unfused ops round: the same as the Triton norm followed by torch's add and mul
    with kernels("triton"):
        unfused = (residual + rms_norm(x, w, 1e-6)) * scale
    assert torch.equal(scaled, unfused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_head_norm_fused_with_rope_reads_the_heads_in_place(dtype, head_dim):
    from flashdesk.kernels.norm import apply_rope, rms_norm_rope
    from flashdesk.kernels.norm_triton import rms_norm_rope_triton

    gen = torch.Generator().manual_seed(5)
    t, heads = 16, 3
    qkv = (torch.randn(t, heads * head_dim + 40, generator=gen) * 2).to(dtype)  # q is a column slice
    q = qkv[:, :heads * head_dim].view(t, heads, head_dim)
    w = torch.rand(head_dim, generator=gen) + 0.5
    angles = torch.arange(t)[:, None] * torch.rand(head_dim // 2, generator=gen)[None, :]
    angles[:, head_dim // 4:] = 0  # partial rotary: the rest of the dims keep cos 1, sin 0
    cos, sin = torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([angles, angles], -1).sin().to(dtype)
    with kernels("triton"):
        got = rms_norm_rope(q, w, cos, sin, 1e-6)
        alone = [rms_norm_rope(q[r:r + 1], w, cos[r:r + 1], sin[r:r + 1], 1e-6) for r in (0, 9, 15)]
        unfused = apply_rope(rms_norm(q, w, 1e-6), cos, sin)
    assert got.shape == (t, heads, head_dim) and got.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 3e-2}
    torch.testing.assert_close(got.float(), apply_rope(rms_norm_reference(q, w, 1e-6), cos, sin).float(), **tol)
    for r, row in zip((0, 9, 15), alone):
        assert torch.equal(row[0], got[r])
    if dtype == torch.bfloat16:  # rounded where the unfused bf16 ops round
        assert torch.equal(got, unfused)
    # heads the kernel cannot read (48 wide) take the unfused ops; the kernel itself refuses them
    odd, w48 = torch.randn(2, 1, 48, generator=gen), torch.rand(48, generator=gen)
    cos48, sin48 = torch.rand(2, 48, generator=gen), torch.rand(2, 48, generator=gen)
    with kernels("triton"):
        fused_or_not = rms_norm_rope(odd, w48, cos48, sin48, 1e-6)
        assert torch.equal(fused_or_not, apply_rope(rms_norm(odd, w48, 1e-6), cos48, sin48))
    with pytest.raises(ValueError, match="power-of-two"):
        rms_norm_rope_triton(odd, w48, cos48, sin48, 1e-6)
