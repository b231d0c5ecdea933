"""Triton linear kernels under the interpreter: W4A16 and dense against the torch reference, rows
1..16 batch invariant bit for bit (with and without split K), and compile specs that name the
kernels' real parameters."""

import inspect
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from flashdesk.kernels import linear_triton as lt
from flashdesk.kernels.int4 import Int4Weight, pack_int4


def random_int4(n, k, group, symmetric, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=gen)
    scale = (torch.rand(n, k // group, generator=gen) * 0.1 + 0.01).to(dtype)
    zero = None if symmetric else torch.randint(-8, 8, (n, k // group), generator=gen).to(torch.int8)
    return Int4Weight(pack_int4(q), scale, zero, group)


def randn(*shape, dtype=torch.float32, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def reference(x, w):
    return F.linear(x.float(), w.dequantize(torch.float32) if isinstance(w, Int4Weight) else w.float())


# (N, K, group, symmetric): groups smaller than a K step (8, 16, 32), equal, larger, channel-wise and
# not a power of two (40); split K (K >= 128 on these narrow N) and not; K = 320 ends in a partial
# 128-column step.
INT4_CASES = [
    (24, 64, 8, True),
    (40, 64, 64, False),
    (24, 128, 32, False),
    (128, 128, 8, False),
    (40, 128, 128, True),
    (24, 512, 32, True),
    (40, 512, 512, False),
    (40, 320, 40, False),
    (24, 320, 320, True),
    (24, 256, 16, False),
]


def case_id(case):
    n, k, group, symmetric = case
    return f"n{n}-k{k}-g{group}-{'sym' if symmetric else 'asym'}"


def test_the_cases_cover_split_and_unsplit_launches():
    splits = {lt.small_tiles(n, k, g).split > 1 for n, k, g, _ in INT4_CASES}
    assert splits == {True, False}


@pytest.mark.parametrize("case", INT4_CASES, ids=case_id)
def test_w4a16_matches_the_dequantized_reference(case):
    n, k, group, symmetric = case
    w = random_int4(n, k, group, symmetric)
    for m in (1, 16, 17):
        x = randn(m, k, seed=m)
        torch.testing.assert_close(lt.w4a16_linear(x, w), reference(x, w), rtol=1e-5, atol=5e-5)


def test_a_split_launch_is_one_kernel_that_leaves_its_counters_at_zero():
    """The last chunk of each tile adds the partials and resets the tile's counter, so the next
    launch (or a CUDA graph's replay) starts clean and no second kernel runs."""
    from flashdesk.kernels.launch_log import count_kernels

    n, k, group, symmetric = INT4_CASES[5]
    w = random_int4(n, k, group, symmetric)
    assert lt.small_tiles(n, k, group).split > 1
    x = randn(3, k)
    with count_kernels() as counts:
        lt.w4a16_linear(x, w)
    assert counts["_linear_kernel"] == 1 and not any("sum" in name or "add" in name for name in counts)
    from flashdesk.kernels.backend import arrival_counters

    counters = arrival_counters(x.device)
    assert not counters.any()
    for _ in range(2):  # again, with the counters as the first launches left them
        torch.testing.assert_close(lt.w4a16_linear(x, w), reference(x, w), rtol=1e-5, atol=5e-5)
    assert not counters.any()


@pytest.mark.parametrize("case", [INT4_CASES[0], INT4_CASES[2], INT4_CASES[5], INT4_CASES[7]], ids=case_id)
def test_w4a16_rows_are_batch_invariant(case):
    n, k, group, symmetric = case
    w = random_int4(n, k, group, symmetric)
    x = randn(16, k)
    full = lt.w4a16_linear(x, w)
    for m in (1, 3):
        assert torch.equal(lt.w4a16_linear(x[:m], w), full[:m])
    for row in (5, 15):
        assert torch.equal(lt.w4a16_linear(x[row : row + 1], w), full[row : row + 1])


@pytest.mark.parametrize("m", [17, 40])
def test_w4a16_prefill_path(m):
    for case in (INT4_CASES[1], INT4_CASES[3]):
        w = random_int4(*case)
        x = randn(m, case[1])
        torch.testing.assert_close(lt.w4a16_linear(x, w), reference(x, w), rtol=1e-5, atol=5e-5)


def test_w4a16_bf16():
    w = random_int4(40, 128, 32, False, dtype=torch.bfloat16)
    for m in (3, 20):
        x = randn(m, 128, dtype=torch.bfloat16)
        out = lt.w4a16_linear(x, w)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), reference(x, w), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("n,k", [(24, 64), (128, 128), (40, 320)])
def test_dense_matches_and_is_batch_invariant(n, k):
    w = randn(n, k, seed=7)
    x = randn(16, k)
    full = lt.dense_linear(x, w)
    torch.testing.assert_close(full, reference(x, w), rtol=1e-5, atol=5e-5)
    for m in (1, 3):
        assert torch.equal(lt.dense_linear(x[:m], w), full[:m])
    assert torch.equal(lt.dense_linear(x[9:10], w), full[9:10])
    x = randn(40, k)
    torch.testing.assert_close(lt.dense_linear(x, w), reference(x, w), rtol=1e-5, atol=5e-5)


def test_dense_bf16():
    w, x = randn(40, 128, dtype=torch.bfloat16, seed=7), randn(5, 128, dtype=torch.bfloat16)
    out = lt.dense_linear(x, w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(x, w), rtol=1e-2, atol=1e-2)


def test_empty_and_mismatched_input():
    w = random_int4(24, 64, 8, True)
    assert lt.w4a16_linear(torch.zeros(0, 64), w).shape == (0, 24)
    with pytest.raises(ValueError):
        lt.w4a16_linear(torch.zeros(2, 32), w)
    with pytest.raises(ValueError):
        lt.dense_linear(torch.zeros(2, 32), torch.zeros(24, 64))


@pytest.mark.parametrize("n,k", [(262144, 2816), (128, 2816), (2816, 2112), (8192, 2816), (24, 64)])
def test_small_tiles_cover_k_in_whole_chunks(n, k):
    for group in (None, 32, k):
        tiles = lt.small_tiles(n, k, group)
        assert tiles.block_m == lt.SMALL_M and tiles.k_chunk % tiles.block_k == 0
        assert (tiles.split - 1) * tiles.k_chunk < k <= tiles.split * tiles.k_chunk  # no empty chunk


def test_compile_specs_name_the_kernel_parameters():
    specs = lt.compile_specs()
    kernels = {spec.fn for spec in specs}
    assert kernels == {lt._linear_kernel}
    names = {spec.name for spec in specs}
    assert len(names) == len(specs)
    for needle in (
        "small_w4_n8192_k2816_g32",
        "prefill_w4_n2816_k4096_g4096_zero",
        "small_bf16_n262144_k2816",
        "small_bf16_n128_k2816",
        "small_bf16_n11264_k2816",
    ):
        assert any(needle in name for name in names), needle
    for spec in specs:
        params = {
            name: p for name, p in inspect.signature(spec.fn.fn).parameters.items() if name != "PDL"
        }  # kernels.check sets it by arch
        assert list(spec.signature) == list(params), spec.name
        constexpr = {name for name, p in params.items() if "constexpr" in str(p.annotation)}
        assert {name for name, ty in spec.signature.items() if ty == "constexpr"} == constexpr, spec.name
        assert set(spec.constexprs) == constexpr, spec.name


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("int4", [True, False], ids=["int4", "dense"])
@pytest.mark.parametrize("n_out, k", [(40, 320), (24, 64)], ids=["split", "unsplit"])
def test_a_glu_projection_applies_the_activation_in_its_epilogue(activation, int4, n_out, k):
    """glu_linear(x, [gate; up]) == act(x @ gate.T) * (x @ up.T), as torch computes it: in fp32 to
    float rounding, in bf16 within a few units of its last place (our tanh and torch's may round
    act(gate) apart); 1..16 rows batch invariant; one kernel for 1..16 rows (no separate
    activation or product). 40 outputs end in a partial tile; K = 320 splits and ends in a partial step."""
    from flashdesk.kernels.backend import kernels
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.linear import gate, glu_linear, linear_reference

    assert (lt.small_tiles(2 * n_out, k, 32).split > 1) == (k == 320)
    for dtype, tol in ((torch.float32, 5e-5), (torch.bfloat16, 0.1)):
        w = random_int4(2 * n_out, k, 32, False, dtype) if int4 else randn(2 * n_out, k, dtype=dtype, seed=3)
        x = randn(17, k, dtype=dtype, seed=4)
        expected = gate(linear_reference(x, w), activation).float()
        with kernels("triton"):
            out = glu_linear(x, w, activation)
            assert out.dtype == dtype and out.shape == (17, n_out)
            torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
            small = glu_linear(x[:16], w, activation)
            torch.testing.assert_close(small.float(), expected[:16], rtol=tol, atol=tol)
            for row in (0, 9, 15):
                assert torch.equal(glu_linear(x[row : row + 1], w, activation), small[row : row + 1])
            with count_kernels() as counts:
                glu_linear(x[:3], w, activation)
    assert sum(counts.values()) == 1, dict(counts)


def test_a_glu_projection_checks_its_input():
    with pytest.raises(ValueError, match="not an even number"):
        lt.w4a16_linear(torch.zeros(2, 64), random_int4(25, 64, 8, True), "gelu_tanh")
    w = random_int4(24, 64, 8, True)
    with pytest.raises(ValueError, match="does not match a weight with 64 inputs"):
        lt.w4a16_linear(torch.zeros(2, 128), w, "gelu_tanh")
    with pytest.raises(ValueError, match="unknown activation"):
        lt.w4a16_linear(torch.zeros(2, 64), w, "relu")


@pytest.mark.parametrize("k", [64, 320], ids=["one chunk", "split K"])
def test_the_heads_softcap_in_its_epilogue_is_the_torch_paths(k):
    """Gemma's final softcap in the head's epilogue: fp32 logits within a few fp32 ulps of the
    torch path's (the head's output rounded to bf16 first, then cap * tanh(logits / cap)), rows
    alone equal to a 16-row block bit for bit, one launch and no torch op."""
    from flashdesk.kernels.backend import kernels
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.linear import capped_logits, linear

    head = randn(1024 if k == 64 else 96, k, dtype=torch.bfloat16) * 0.05
    x = randn(16, k, dtype=torch.bfloat16, seed=2) * (15 / (0.05 * k**0.5))
    with kernels("torch"):
        want = capped_logits(x, head, 30.0)
    rounded = F.linear(x, head).float()  # the reference's steps, written out
    assert torch.equal(want, torch.tanh(rounded / 30.0) * 30.0) and want.abs().max() < 30
    with kernels("triton"):
        got = capped_logits(x, head, 30.0)
        plain = linear(x, head).float()  # the same projection, its output rounded to bf16, uncapped
        with count_kernels() as counts:
            capped_logits(x[:1], head, 30.0)
        for i in (0, 9, 15):
            assert torch.equal(capped_logits(x[i : i + 1], head, 30.0)[0], got[i]), i
    assert got.dtype == torch.float32 and dict(counts) == {"_linear_kernel": 1}
    # the epilogue against the torch cap of the same projection: a few fp32 ulps (a missing bf16
    # rounding before the cap is ~1e-2); against the torch path: its own bf16 rounding of the dot
    assert (got - torch.tanh(plain / 30.0) * 30.0).abs().max() <= 1e-5 * 30
    assert (got - want).abs().max() <= 0.1
    assert (got.abs() > 20).any() and (got.abs() < 5).any()  # the curve, not only its flat ends
