"""The Triton RMSNorm against the torch definition, and its rows independent of the row count."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels.backend import CompileSpec, kernels
from flashdesk.kernels.norm import rms_norm, rms_norm_reference

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
            assert torch.equal(rms_norm(x[r : r + 1], w, 1e-6)[0], block[r])


def test_compile_specs_name_every_argument():
    from flashdesk.kernels.norm_triton import compile_specs

    for spec in compile_specs():
        assert isinstance(spec, CompileSpec)
        assert list(spec.signature) == [n for n in spec.fn.arg_names if n != "PDL"]  # PDL: by arch
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
        alone = [rms_norm(x[r : r + 1], w, 1e-6, residual=residual[r : r + 1], scale=scale) for r in range(6)]
    torch.testing.assert_close(added.float(), (residual + rms_norm_reference(x, w, 1e-6)).float(), **tol)
    torch.testing.assert_close(scaled.float(), ((residual + rms_norm_reference(x, w, 1e-6)) * scale).float(), **tol)
    assert torch.equal(torch.cat(alone), scaled)  # rows do not depend on the row count
    # it rounds where the unfused ops round: the same as the Triton norm followed by torch's add and mul
    with kernels("triton"):
        unfused = (residual + rms_norm(x, w, 1e-6)) * scale
    assert torch.equal(scaled, unfused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k_eq_v", [False, True], ids=["v", "k_eq_v"])
def test_q_k_v_norms_and_rope_are_one_kernel_on_the_projection(dtype, k_eq_v):
    """q and k: their head norm and rotate-half RoPE; v: a weightless norm (of the k projection
    with k_eq_v); read in place from the fused projection, rounded where the unfused ops round."""
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.norm import qkv_norms, qkv_norms_reference
    from flashdesk.kernels.norm_triton import head_norms_triton

    gen = torch.Generator().manual_seed(5)
    t, heads, kv_heads, d = 16, 4, 2, 32
    qkv = (torch.randn(t, (heads + kv_heads * (1 if k_eq_v else 2)) * d, generator=gen) * 2).to(dtype)
    q_w, k_w = torch.rand(d, generator=gen) + 0.5, torch.rand(d, generator=gen) + 0.5
    angles = torch.arange(t)[:, None] * torch.rand(d // 2, generator=gen)[None, :]
    angles[:, d // 4 :] = 0  # partial rotary: the rest of the dims keep cos 1, sin 0
    cos, sin = torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([angles, angles], -1).sin().to(dtype)
    args = (q_w, k_w, cos, sin, 1e-6, heads, kv_heads, d, k_eq_v)
    with kernels("triton"):
        got = qkv_norms(qkv, *args)
        unfused = qkv_norms_reference(qkv, *args)  # its norms are the Triton norm kernel
        alone = {r: qkv_norms(qkv[r : r + 1], q_w, k_w, cos[r : r + 1], sin[r : r + 1], *args[4:]) for r in (0, 9, 15)}
        with count_kernels() as counts:
            qkv_norms(qkv, *args)
    assert sum(counts.values()) == 1, dict(counts)
    with kernels("torch"):
        reference = qkv_norms_reference(qkv, *args)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 3e-2}
    for name, fused, plain, ref in zip("qkv", got, unfused, reference):
        assert fused.shape == ref.shape and fused.dtype == dtype, name
        torch.testing.assert_close(fused.float(), ref.float(), **tol, msg=name)
        if dtype == torch.bfloat16:  # rounded where the unfused bf16 ops round
            assert torch.equal(fused, plain), name
        for r, row in alone.items():
            assert torch.equal(row["qkv".index(name)][0], fused[r]), (name, r)
    # heads the kernel cannot read (48 wide) take the unfused ops; the kernel itself refuses them
    odd = torch.randn(2, (heads + 2 * kv_heads) * 48, generator=gen)
    w48, cs48 = torch.rand(48, generator=gen), torch.rand(2, 48, generator=gen)
    odd_args = (w48, w48, cs48, cs48, 1e-6, heads, kv_heads, 48, False)
    with kernels("triton"):
        for fused_or_not, plain in zip(qkv_norms(odd, *odd_args), qkv_norms_reference(odd, *odd_args)):
            assert torch.equal(fused_or_not, plain)
        with pytest.raises(ValueError, match="power-of-two"):
            head_norms_triton(None, odd.view(2, -1, 48), w48, w48, cs48, cs48, 1e-6, kv_heads, "none", True)


@pytest.mark.parametrize("storage", ["fp8", "bf16"])
@pytest.mark.parametrize("k_eq_v", [False, True], ids=["v", "k_eq_v"])
def test_q_k_v_norms_store_k_and_v_into_the_cache_as_kv_write_does(storage, k_eq_v):
    """A decode block's k and v go straight from the norm kernel into the cache (one kernel, not
    two): the same bytes and scales as returning them and writing them with kv_write's definition,
    at slots that wrap around a ring; the torch path stores them too."""
    from flashdesk.kernels.kv_write import FP8, KVSlots, kv_write_reference
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.norm import qkv_norms

    gen = torch.Generator().manual_seed(8)
    t, heads, kv_heads, d, capacity = 5, 4, 2, 32, 8
    qkv = (torch.randn(t, (heads + kv_heads * (1 if k_eq_v else 2)) * d, generator=gen) * 2).to(torch.bfloat16)
    angles = torch.arange(6, 6 + t)[:, None] * torch.rand(d // 2, generator=gen)[None, :]
    cos, sin = (f(torch.cat([angles, angles], -1)).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    args = (
        torch.rand(d, generator=gen) + 0.5,
        torch.rand(d, generator=gen) + 0.5,
        cos,
        sin,
        1e-6,
        heads,
        kv_heads,
        d,
        k_eq_v,
    )

    def cache():
        dtype, fp8 = (FP8, True) if storage == "fp8" else (torch.bfloat16, False)
        k, v = (torch.zeros(capacity, kv_heads, d, dtype=dtype) for _ in range(2))
        scales = (torch.zeros(capacity, kv_heads), torch.zeros(capacity, kv_heads)) if fp8 else (None, None)
        return KVSlots(k, v, *scales, torch.tensor([6], dtype=torch.int32), capacity)  # slots 6, 7, 0, 1, 2

    def as_bits(x):
        return x.view(torch.uint8) if x.dtype == FP8 else x

    for path in ("triton", "torch"):
        stored, written, again = cache(), cache(), cache()
        with kernels(path):
            q, k, v = qkv_norms(qkv, *args, into=stored)
            q_plain, k_plain, v_plain = qkv_norms(qkv, *args)
            with count_kernels() as counts:
                qkv_norms(qkv, *args, into=again)
        kv_write_reference(k_plain, v_plain, *written)
        assert k is None and v is None and torch.equal(q, q_plain), path
        for got, want in zip(stored[:4], written[:4]):
            assert (got is None) == (want is None) and (got is None or torch.equal(as_bits(got), as_bits(want))), path
        assert torch.equal(as_bits(stored.k[3:6]), torch.zeros_like(as_bits(stored.k[3:6])))  # slots not in the block
        if path == "triton":
            assert sum(counts.values()) == 1, dict(counts)


@pytest.mark.parametrize("with_q", [True, False], ids=["block", "context"])
def test_the_drafters_norms_store_k_and_v_into_its_context_as_kv_write_does(with_q):
    """The drafter's block (q, k, v) and context (k, v) projections: q/k norms + RoPE with k and v
    (as projected) stored in the context ring, one kernel, the bytes of the norms then kv_write; a
    block longer than the ring takes the norms and kv_write, which keeps the newest positions."""
    from flashdesk.kernels.kv_write import KVSlots, kv_write
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.norm import drafter_qk_norms, drafter_store_kv

    gen = torch.Generator().manual_seed(12)
    heads, kv_heads, d, capacity = 4, 2, 32, 8
    w = [(torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16) for _ in range(2)]

    def ring():
        return KVSlots(
            torch.zeros(capacity, kv_heads, d, dtype=torch.bfloat16),
            torch.zeros(capacity, kv_heads, d, dtype=torch.bfloat16),
            None,
            None,
            torch.tensor([5], dtype=torch.int32),
            capacity,
        )

    for t in (5, 11):  # within the ring, and past it
        qkv = torch.randn(t, heads + 2 * kv_heads, d, generator=gen).to(torch.bfloat16)
        q, kv = (qkv[:, :heads] if with_q else None), qkv[:, heads:]
        angles = torch.arange(5, 5 + t)[:, None] * torch.rand(d // 2, generator=gen)[None, :]
        cos, sin = (f(torch.cat([angles, angles], -1)).to(torch.bfloat16) for f in (torch.cos, torch.sin))
        stored, written, again = ring(), ring(), ring()
        with kernels("triton"):
            got_q = drafter_store_kv(q, kv, w[0] if with_q else None, w[1], cos, sin, 1e-6, stored)
            want_q, k = drafter_qk_norms(q, kv[:, :kv_heads], w[0] if with_q else None, w[1], cos, sin, 1e-6)
            kv_write(k, kv[:, kv_heads:], *written)
            with count_kernels() as counts:
                drafter_store_kv(q, kv, w[0] if with_q else None, w[1], cos, sin, 1e-6, again)
        assert (got_q is None) == (not with_q) and (got_q is None or torch.equal(got_q, want_q))
        assert torch.equal(stored.k, written.k) and torch.equal(stored.v, written.v), t
        if t <= capacity:
            assert sum(counts.values()) == 1, dict(counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_q", [True, False], ids=["block", "context"])
def test_the_drafters_q_k_norms_and_rope_are_one_kernel(dtype, with_q):
    """The DFlash drafter's Qwen3 norms (rounded before the weight) + RoPE of q and k, read in place
    from its projections (k a column slice of kv); without q, the context's keys alone."""
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.norm import apply_rope, drafter_qk_norms, qwen_rms_norm

    gen = torch.Generator().manual_seed(11)
    t, heads, kv_heads, d = 16, 4, 2, 32
    q = (torch.randn(t, heads, d, generator=gen) * 2).to(dtype) if with_q else None
    kv = (torch.randn(t, 2 * kv_heads, d, generator=gen) * 2).to(dtype)
    k = kv[:, :kv_heads]
    q_w, k_w = (torch.rand(d, generator=gen) + 0.5).to(dtype), (torch.rand(d, generator=gen) + 0.5).to(dtype)
    angles = torch.arange(t)[:, None] * torch.rand(d // 2, generator=gen)[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([angles, angles], -1).sin().to(dtype)
    with kernels("triton"):
        got_q, got_k = drafter_qk_norms(q, k, q_w, k_w, cos, sin, 1e-6)
        alone = drafter_qk_norms(None if q is None else q[9:10], k[9:10], q_w, k_w, cos[9:10], sin[9:10], 1e-6)
        with count_kernels() as counts:
            drafter_qk_norms(q, k, q_w, k_w, cos, sin, 1e-6)
    assert sum(counts.values()) == 1, dict(counts)
    want_k = apply_rope(qwen_rms_norm(k, k_w, 1e-6), cos, sin)
    pairs = [(got_k, want_k, alone[1])]
    if with_q:
        pairs.append((got_q, apply_rope(qwen_rms_norm(q, q_w, 1e-6), cos, sin), alone[0]))
    else:
        assert got_q is None
    for got, want, row in pairs:
        assert got.shape == want.shape and got.dtype == dtype
        if dtype == torch.bfloat16:  # rounds where the torch ops round (the norm before the weight):
            # the same bits but where their sums of squares, added in another order, round apart
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=4e-2)
            assert (got == want).float().mean() >= 0.99  # rounding after the weight instead: ~75%
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(row[0], got[9])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drafters_residual_add_and_norm_are_one_kernel(dtype):
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.norm import add_qwen_norm, qwen_rms_norm

    gen = torch.Generator().manual_seed(12)
    h, y = (torch.randn(16, 96, generator=gen) * 3).to(dtype), torch.randn(16, 96, generator=gen).to(dtype)
    w = (torch.rand(96, generator=gen) + 0.5).to(dtype)
    with kernels("triton"):
        total, x = add_qwen_norm(h, y, w, 1e-6)
        alone = add_qwen_norm(h[4:5], y[4:5], w, 1e-6)
        same, plain = add_qwen_norm(h, None, w, 1e-6)
        with count_kernels() as counts:
            add_qwen_norm(h, y, w, 1e-6)
    assert sum(counts.values()) == 1, dict(counts)
    assert torch.equal(total, h + y) and same is h
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 4e-2}
    torch.testing.assert_close(x.float(), qwen_rms_norm(h + y, w, 1e-6).float(), **tol)
    if dtype == torch.bfloat16:  # rounded before the weight, as the torch ops round
        assert (x == qwen_rms_norm(h + y, w, 1e-6)).float().mean() >= 0.99
    torch.testing.assert_close(plain.float(), qwen_rms_norm(h, w, 1e-6).float(), **tol)
    assert torch.equal(alone[0][0], total[4]) and torch.equal(alone[1][0], x[4])
