"""Fused int4 MoE Triton kernels under the interpreter: same function as moe_reference, batch
invariant bit for bit, no host sync on the decode/verify path, compile specs that match the launches."""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels import moe_small_triton, moe_triton
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.int4 import Int4Weight, pack_int4
from flashdesk.kernels.launch_log import describe_launch
from flashdesk.kernels.moe import DenseMlp, moe_reference
from flashdesk.kernels.moe_triton import compile_specs, dense_chunks, fused_moe, fused_router_moe, fused_routed_moe
from flashdesk.kernels.moe_rows_triton import tiles
from flashdesk.kernels.router import ordered_sum

pytestmark = pytest.mark.skipif(not moe_triton.interpreted(), reason="needs TRITON_INTERPRET=1 before triton import")

E = 8
WHOLE = (64, 32)  # (D, I): the small path takes each expert matrix as one tile
TILED = (128, 48)  # the small path cuts them as for the real model: N blocks, K steps, a masked K tail


def random_int4(gen, shape, group, asym, dtype=torch.float32) -> Int4Weight:
    """Random packed int4 [E, out, in] with group scales (and int8 zero points when asymmetric)."""
    e, out, inp = shape
    q = torch.randint(-8, 8, shape, generator=gen)
    scale = (torch.rand(e, out, inp // group, generator=gen) * 0.05 + 0.01).to(dtype)
    zero = torch.randint(-3, 4, (e, out, inp // group), generator=gen).to(torch.int8) if asym else None
    return Int4Weight(pack_int4(q), scale, zero, group)


def problem(seed, tokens, top_k, group, asym, dtype=torch.float32, dims=WHOLE):
    """x, gate_up, down, top_idx (distinct experts per token), top_w; group None = channel-wise."""
    D, I = dims
    gen = torch.Generator().manual_seed(seed)
    gate_up = random_int4(gen, (E, 2 * I, D), group or D, asym, dtype)
    down = random_int4(gen, (E, D, I), group or I, asym, dtype)
    x = torch.randn(tokens, D, generator=gen).to(dtype)
    top_idx = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(tokens)])
    top_w = torch.rand(tokens, top_k, generator=gen)
    return x, gate_up, down, top_idx, top_w


def test_test_shapes_cover_both_small_tilings():
    """WHOLE runs one program per slot, TILED the real model's blocks (so both are tested)."""
    for n, k, config in ((32, 64, moe_small_triton.SMALL_GATE_UP), (64, 32, moe_small_triton.SMALL_DOWN)):
        assert tiles(config, n, k, small=True)[1:3] == (n, k)
    for n, k, config in ((48, 128, moe_small_triton.SMALL_GATE_UP), (128, 48, moe_small_triton.SMALL_DOWN)):
        assert tiles(config, n, k, small=True) == config


CASES = [
    (1, 2, 8, False, WHOLE),
    (1, 3, None, True, WHOLE),
    (5, 3, 16, True, WHOLE),
    (5, 2, 8, False, WHOLE),
    (16, 2, None, True, WHOLE),
    (16, 3, 8, False, WHOLE),
    (40, 2, 16, True, WHOLE),
    (40, 3, 8, False, WHOLE),
    (1, 2, 16, True, TILED),
    (16, 3, None, False, TILED),
    (40, 2, 8, True, TILED),
]


@pytest.mark.parametrize("tokens,top_k,group,asym,dims", CASES)
def test_matches_reference(tokens, top_k, group, asym, dims):
    args = problem(tokens * 10 + top_k, tokens, top_k, group, asym, dims=dims)
    torch.testing.assert_close(fused_moe(*args), moe_reference(*args), rtol=1e-5, atol=1e-4)


def _as_fp32(weight: Int4Weight) -> Int4Weight:
    return Int4Weight(weight.packed, weight.scale.float(), weight.zero, weight.group_size)


def test_bf16_as_accurate_as_reference():
    """bf16 roundings differ from the reference's, so both are measured against the fp32 function."""
    x, gate_up, down, top_idx, top_w = problem(7, 5, 2, 16, True, torch.bfloat16)
    out = fused_moe(x, gate_up, down, top_idx, top_w)
    assert out.dtype == torch.bfloat16
    truth = moe_reference(x.float(), _as_fp32(gate_up), _as_fp32(down), top_idx, top_w)
    reference_error = (moe_reference(x, gate_up, down, top_idx, top_w).float() - truth).abs().max()
    assert (out.float() - truth).abs().max() <= 2 * reference_error


def test_large_gelu_inputs_stay_finite():
    """tanh via exp must not turn into inf/inf for |u| large."""
    x, gate_up, down, top_idx, top_w = problem(3, 1, 2, 8, False)
    x = x * 1e4
    out = fused_moe(x, gate_up, down, top_idx, top_w)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, moe_reference(x, gate_up, down, top_idx, top_w), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("top_k,group,asym,dims", [(3, 16, True, WHOLE), (2, None, False, WHOLE), (3, 8, True, TILED)])
def test_batch_invariant(top_k, group, asym, dims):
    """A token's output has the same bits alone, among 5 or among 16 tokens sharing its experts."""
    x, gate_up, down, top_idx, top_w = problem(11, 16, top_k, group, asym, dims=dims)
    full = fused_moe(x, gate_up, down, top_idx, top_w)
    for rows in ([0], [11], [3, 9, 15, 0, 7]):
        part = fused_moe(x[rows], gate_up, down, top_idx[rows], top_w[rows])
        assert torch.equal(part, full[rows]), rows


def test_a_block_runs_both_expert_stages_in_one_launch_that_leaves_its_counters_at_zero(monkeypatch):
    """Decode and verify blocks run the gate/up and down items in one launch (moe_small_triton),
    the down items waiting on per-slot counters; its last item puts every counter it used back to
    zero, which the next launch and a replayed CUDA graph count from (a slot missed by the reset,
    or no reset, fails here). Prefill keeps its two kernels."""
    import triton.language as tl

    from flashdesk.kernels.backend import arrival_counters
    from flashdesk.kernels.moe_small_triton import SMALL_DOWN, SMALL_GATE_UP

    launched, waits = [], []
    kernel = moe_small_triton._experts_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]

    def wait_count(counter, target):  # the interpreter runs items in ticket order: each wait is met
        waits.append((tl.atomic_add(counter, 0, sem="acquire").handle.data.item(), target))

    monkeypatch.setattr(moe_small_triton, "_experts_kernel", Spy())
    monkeypatch.setattr(moe_small_triton, "wait_count", wait_count)
    x, gate_up, down, top_idx, top_w = problem(17, 16, 3, 8, True, dims=TILED)
    dense = DenseMlp(x, *dense_mlp(17, 16, 2, 8, True, dims=TILED)[1:])
    experts, partials = fused_moe(x, gate_up, down, top_idx, top_w, summed=False, dense=dense)
    assert launched and not arrival_counters(x.device).any()
    # every down item waited on its own slot's counter, which its gate/up items had just filled
    (grid,) = launched[0]
    d, i = TILED
    up, down_blocks = (-(-n // tiles(c, n, k, True)[1]) for c, n, k in ((SMALL_GATE_UP, i, d), (SMALL_DOWN, d, i)))
    assert len(waits) == grid // (up + down_blocks) * down_blocks and all(seen == up for seen, _ in waits), waits
    torch.testing.assert_close(partials.sum(0), dense_reference(dense), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(experts.sum(1), moe_reference(x, gate_up, down, top_idx, top_w), rtol=1e-4, atol=1e-3)
    launched.clear()
    fused_moe(*problem(18, 17, 2, 8, False, dims=TILED))
    assert not launched


def test_unsummed_pair_outputs_sum_in_top_k_order_to_the_output():
    """summed=False hands the next kernel each token's weighted expert outputs: summed in top-k
    order and rounded, they are the summed call's bits (what mlp_out_norms relies on)."""
    x, gate_up, down, top_idx, top_w = problem(13, 5, 3, 16, True, torch.bfloat16)
    pairs = fused_moe(x, gate_up, down, top_idx, top_w, summed=False)
    assert pairs.shape == (5, 3, x.shape[1]) and pairs.dtype == torch.float32
    assert torch.equal(ordered_sum(pairs.movedim(1, -1)).to(x.dtype), fused_moe(x, gate_up, down, top_idx, top_w))


def dense_mlp(seed, tokens, chunks, group, asym, dtype=torch.float32, dims=WHOLE) -> DenseMlp:
    """A dense GLU MLP whose intermediate is `chunks` experts' I, in the experts' int4 format."""
    d, i = dims
    gen = torch.Generator().manual_seed(seed)
    gate_up = random_int4(gen, (1, 2 * chunks * i, d), group, asym, dtype)[0]
    down = random_int4(gen, (1, d, chunks * i), group, asym, dtype)[0]
    return DenseMlp(torch.randn(tokens, d, generator=gen).to(dtype), gate_up, down)


def dense_reference(dense: DenseMlp) -> torch.Tensor:
    """down(gelu_tanh(gate x) * up x) on the dequantized weights, in fp32 throughout."""
    gate, up = (dense.x @ dense.gate_up.dequantize(torch.float32).T).chunk(2, dim=-1)
    g = 0.5 * gate * (1 + torch.tanh(0.7978845608028654 * (gate + 0.044715 * gate**3)))
    return (g * up) @ dense.down.dequantize(torch.float32).T


DENSE_CASES = [(1, 2, 8, False, WHOLE), (5, 3, 16, True, WHOLE), (16, 2, 8, True, TILED), (1, 3, 16, False, TILED)]


@pytest.mark.parametrize("tokens,top_k,group,asym,dims", DENSE_CASES)
def test_a_dense_mlp_runs_as_extra_slots_of_the_expert_kernels(tokens, top_k, group, asym, dims):
    """With a dense MLP of whole expert-sized chunks the expert launch also computes it: the
    experts' outputs keep their bits, and the chunks' fp32 partials summed in order are the dense
    MLP (against an fp32 torch reference on the dequantized weights)."""
    args = problem(tokens * 7 + top_k, tokens, top_k, group, asym, dims=dims)
    dense = dense_mlp(tokens, tokens, 3, group, asym, dims=dims)
    assert dense_chunks(dense, args[0], args[1], args[2]) == 3
    experts, partials = fused_moe(*args, summed=False, dense=dense)
    assert torch.equal(experts, fused_moe(*args, summed=False))
    assert partials.shape == (3, tokens, dims[0]) and partials.dtype == torch.float32
    torch.testing.assert_close(ordered_sum(partials.movedim(0, -1)), dense_reference(dense), rtol=1e-5, atol=1e-4)


def test_the_dense_chunks_are_batch_invariant_and_rounded_as_the_glu_linear_rounds():
    """A token's dense partials have the same bits alone as among 16; in bf16 the chunks round
    gate, up, act(gate) and the product as the linear's GLU epilogue does, so they land within the
    reference's own bf16 error of the fp32 function."""
    x, gate_up, down, top_idx, top_w = problem(21, 16, 2, 8, True, torch.bfloat16, dims=TILED)
    dense = dense_mlp(5, 16, 2, 8, True, torch.bfloat16, dims=TILED)
    _, full = fused_moe(x, gate_up, down, top_idx, top_w, summed=False, dense=dense)
    for rows in ([0], [3, 9, 15]):
        part = DenseMlp(dense.x[rows], dense.gate_up, dense.down)
        _, partials = fused_moe(x[rows], gate_up, down, top_idx[rows], top_w[rows], summed=False, dense=part)
        assert torch.equal(partials, full[:, rows]), rows
    truth = dense_reference(DenseMlp(dense.x.float(), *(_as_fp32(w) for w in dense[1:])))
    gate, up = (dense.x @ dense.gate_up.dequantize(torch.bfloat16).T).chunk(2, dim=-1)
    bf16 = (torch.nn.functional.gelu(gate, approximate="tanh") * up) @ dense.down.dequantize(torch.bfloat16).T
    ours = ordered_sum(full.movedim(0, -1)).to(torch.bfloat16)
    assert (ours.float() - truth).abs().max() <= 2 * (bf16.float() - truth).abs().max()


def test_a_dense_mlp_that_does_not_fit_the_expert_kernels_is_left_out():
    """dense_chunks is 0 (the dense MLP runs on its own) past the small path, for another group
    size or zero-point format, an intermediate that is not whole experts, dense (bf16) weights, an
    input of another dtype, or non-contiguous weights."""
    _, gate_up, down, _, _ = problem(3, 1, 2, 8, False)
    fits = dense_mlp(1, 4, 2, 8, False)
    x = torch.zeros(4, WHOLE[0])
    assert dense_chunks(fits, x, gate_up, down) == 2
    assert dense_chunks(None, x, gate_up, down) == 0
    assert dense_chunks(DenseMlp(torch.zeros(17, WHOLE[0]), *fits[1:]), torch.zeros(17, WHOLE[0]), gate_up, down) == 0
    assert dense_chunks(dense_mlp(1, 4, 2, 16, False), x, gate_up, down) == 0  # group 16, experts 8
    assert dense_chunks(dense_mlp(1, 4, 2, 8, True), x, gate_up, down) == 0  # zero points, experts none
    odd = dense_mlp(1, 4, 1, 8, False, dims=(WHOLE[0], WHOLE[1] + 8))  # 40 columns: not whole 32s
    assert dense_chunks(odd, x, gate_up, down) == 0
    plain = DenseMlp(fits.x, fits.gate_up.dequantize(torch.float32), fits.down.dequantize(torch.float32))
    assert dense_chunks(plain, x, gate_up, down) == 0
    assert dense_chunks(fits, x.to(torch.bfloat16), gate_up, down) == 0
    strided = Int4Weight(fits.down.packed.t().contiguous().t(), fits.down.scale, None, 8)
    assert dense_chunks(DenseMlp(fits.x, fits.gate_up, strided), x, gate_up, down) == 0


@pytest.mark.parametrize("tokens,top_k", [(1, 2), (16, 3), (70, 2)])
def test_routing_with_the_grouping_is_route_then_the_experts(tokens, top_k):
    """Decode and verify blocks route their tokens in the grouping kernel (one launch for both);
    past what one program groups (70 x 2 pairs) the router's own kernel runs first. Either way it is
    route() then fused_moe, and a token's output has the same bits alone as among the block."""
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.router import route

    x, gate_up, down, _, _ = problem(tokens + top_k, tokens, top_k, 8, True, torch.bfloat16)
    gen = torch.Generator().manual_seed(tokens)
    logits = torch.stack([torch.randperm(E, generator=gen) for _ in range(tokens)]).to(torch.bfloat16) / 4 - 1
    scale = (torch.rand(E, generator=gen) + 0.5).to(torch.bfloat16)
    with kernels("triton"):
        got = fused_routed_moe(x, gate_up, down, logits, top_k, scale)
        with count_kernels() as counts:  # (launches counted, not run)
            fused_routed_moe(x, gate_up, down, logits, top_k, scale)
        top_w, top_idx = route(logits, top_k, scale)
        want = fused_moe(x, gate_up, down, top_idx, top_w)
        alone = [
            fused_routed_moe(x[r : r + 1], gate_up, down, logits[r : r + 1], top_k, scale) for r in (0, tokens - 1)
        ]
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)  # the softmax sums in another order
    one_program = tokens * top_k <= moe_triton.GROUP_PAIRS
    assert (counts["_route_group_kernel"], counts["_route_kernel"]) == ((1, 0) if one_program else (0, 1))
    if one_program:
        assert torch.equal(alone[0][0], got[0]) and torch.equal(alone[1][0], got[-1])


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_one_tokens_pairs_are_grouped_by_rank_as_the_torch_sort_groups_them(top_k):
    """A decode step's token groups its top-k pairs by rank (its experts are distinct), with
    `_route`'s order, ranges and experts exactly, and the routing's weights."""
    import triton

    from flashdesk.kernels.router import route

    experts = 128  # the real router's
    gen = torch.Generator().manual_seed(top_k)
    logits = torch.randperm(experts, generator=gen)[None, :].to(torch.bfloat16) / 4 - 1
    scale = (torch.rand(experts, generator=gen) + 0.5).to(torch.bfloat16)
    weight, ids = torch.empty(top_k), torch.empty(top_k, dtype=torch.int32)
    order, begin, end, expert = (torch.full((top_k,), -1, dtype=torch.int32) for _ in range(4))
    with kernels("triton"):
        moe_triton._route_group_kernel[(1,)](
            logits, scale, weight, ids, order, begin, end, expert, 1, top_k,
            E=experts, TOP_K=top_k, ROUTE_ROWS=moe_triton.ROUTE_ROWS, BLOCK_E=experts,
            BLOCK_K=triton.next_power_of_2(top_k), BLOCK_P=moe_triton.GROUP_PAIRS, CHUNK=moe_triton.GROUP_CHUNK,
            ONE_TOKEN=True,
        )  # fmt: skip
        top_w, top_idx = route(logits, top_k, scale)
    assert torch.equal(ids, top_idx.reshape(-1).to(torch.int32)) and torch.equal(weight, top_w.reshape(-1))
    for got, want in zip((order, begin, end, expert), moe_triton._route(top_idx, experts)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("tokens,top_k,d", [(1, 2, 64), (16, 3, 64), (5, 2, 320), (70, 2, 64)])
def test_the_router_kernel_is_the_router_linear_then_routing(tokens, top_k, d):
    """A decode or verify block's router projection, routing and grouping are one launch, with the
    bits of `linear` then fused_routed_moe: the same logits (the linear's tiles and chunk order;
    D = 320 splits the projection into chunks and ends in a partial step), hence the same experts
    and outputs; a token alone gets its bits in the block. Past what one program groups (70 x 2
    pairs), linear and the router's own kernel run."""
    from flashdesk.kernels.launch_log import count_kernels
    from flashdesk.kernels.linear import linear

    x, gate_up, down, _, _ = problem(tokens + top_k, tokens, top_k, 8, True, torch.bfloat16)
    gen = torch.Generator().manual_seed(tokens)
    router_x = torch.randn(tokens, d, generator=gen).to(torch.bfloat16)
    router = (torch.randn(E, d, generator=gen) / d**0.5).to(torch.bfloat16)
    scale = (torch.rand(E, generator=gen) + 0.5).to(torch.bfloat16)
    with kernels("triton"):
        got = fused_router_moe(x, gate_up, down, router_x, router, top_k, scale)
        want = fused_routed_moe(x, gate_up, down, linear(router_x, router), top_k, scale)
        with count_kernels() as counts:  # (launches counted, not run)
            fused_router_moe(x, gate_up, down, router_x, router, top_k, scale)
        alone = [
            fused_router_moe(x[r : r + 1], gate_up, down, router_x[r : r + 1], router, top_k, scale)
            for r in (0, tokens - 1)
        ]
    assert torch.equal(got, want)
    fused = tokens * top_k <= moe_triton.GROUP_PAIRS
    routing = {name: counts[name] for name in ("_router_kernel", "_route_group_kernel", "_route_kernel")}
    assert routing == (
        {"_router_kernel": 1, "_route_group_kernel": 0, "_route_kernel": 0}
        if fused
        else {"_router_kernel": 0, "_route_group_kernel": 0, "_route_kernel": 1}
    ), dict(counts)
    if fused:
        assert torch.equal(alone[0][0], got[0]) and torch.equal(alone[1][0], got[-1])
    with kernels("triton"), pytest.raises(ValueError, match=f"does not match a (router of|weight with) {d} inputs"):
        fused_router_moe(x, gate_up, down, router_x[:, :-1], router, top_k, scale)


def _no_sync(name):
    original = getattr(torch.Tensor, name)

    def guarded(self, *args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith("triton"):  # the interpreter itself copies tensors around
            raise AssertionError(f"host sync: Tensor.{name} from {caller}")
        return original(self, *args, **kwargs)

    return guarded


@pytest.mark.parametrize("tokens", [1, 16])
def test_no_host_sync(monkeypatch, tokens):
    args = problem(5, tokens, 2, 8, True)
    expected = moe_reference(*args)
    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, _no_sync(name))
    with pytest.raises(AssertionError, match="host sync"):
        torch.ones(1).item()
    out = fused_moe(*args)
    monkeypatch.undo()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


class _Recorder:
    """Stands in for a jitted kernel: records each launch's arguments instead of running it."""

    def __init__(self, fn, launches):
        self.fn, self.launches = fn, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.fn, args, kwargs))


def _constexpr_names(fn):
    """A kernel's constexprs but PDL (kernels.check sets it by arch)."""
    return [name for name, ann in fn.fn.__annotations__.items() if "constexpr" in str(ann) and name != "PDL"]


def _key(fn, signature, constexprs, num_warps, num_stages, maxnreg):
    return fn, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())), num_warps, num_stages, maxnreg


def _launch_key(fn, args, kwargs):
    """A launch as a (kernel, signature, constexprs, warps, stages, maxnreg) key comparable with a CompileSpec's."""
    launch = describe_launch(fn.fn, args, kwargs)
    signature = dict(launch["signature"], **dict.fromkeys(launch["constexprs"], "constexpr"))
    return _key(fn, signature, launch["constexprs"], launch["num_warps"], launch["num_stages"], launch.get("maxnreg"))


def test_compile_specs_match_launches(monkeypatch):
    """The real model's launches (both paths, sym and asym, bf16) are exactly the listed specs."""
    specs = compile_specs()
    for spec in specs:
        assert list(spec.signature) == [n for n in spec.fn.arg_names if n != "PDL"]  # PDL: by arch
        assert [k for k, v in spec.signature.items() if v == "constexpr"] == _constexpr_names(spec.fn)
        assert set(spec.constexprs) == set(_constexpr_names(spec.fn))
    launches = []
    for name in (
        "_group_pairs_kernel",
        "_route_group_kernel",
        "_router_kernel",
        "_gate_up_kernel",
        "_down_kernel",
        "_sum_top_k_kernel",
    ):
        monkeypatch.setattr(moe_triton, name, _Recorder(getattr(moe_triton, name), launches))
    monkeypatch.setattr(moe_small_triton, "_experts_kernel", _Recorder(moe_small_triton._experts_kernel, launches))
    monkeypatch.setattr(moe_triton, "interpreted", lambda: False)
    e, d, inter, top_k, group = 128, moe_triton.REAL_D, moe_triton.REAL_I, moe_triton.REAL_TOP_K, moe_triton.REAL_GROUP

    def fake(out, inp, asym):  # shapes and dtypes only: the recorder reads no data
        packed = torch.zeros(1, 1, 1, dtype=torch.int32).expand(e, out, inp // 8)
        scale = torch.zeros(1, 1, 1, dtype=torch.bfloat16).expand(e, out, inp // group)
        zero = torch.zeros(1, 1, 1, dtype=torch.int8).expand(e, out, inp // group) if asym else None
        return Int4Weight(packed, scale, zero, group)

    def contiguous(w):
        return Int4Weight(*(None if t is None else t.contiguous() for t in (w.packed, w.scale, w.zero)), group)

    for asym in (False, True):
        for tokens in (1, 16, 64):
            x = torch.zeros(tokens, d, dtype=torch.bfloat16)
            top_idx = torch.stack([torch.randperm(e)[:top_k] for _ in range(tokens)])
            fused_moe(x, fake(2 * inter, d, asym), fake(d, inter, asym), top_idx, torch.rand(tokens, top_k))
            logits, scale = torch.randn(tokens, e).to(torch.bfloat16), torch.ones(e, dtype=torch.bfloat16)
            fused_routed_moe(x, fake(2 * inter, d, asym), fake(d, inter, asym), logits, top_k, scale, summed=False)
            router = torch.zeros(1, 1, dtype=torch.bfloat16).expand(e, d)
            fused_router_moe(x, fake(2 * inter, d, asym), fake(d, inter, asym), x, router, top_k, scale, summed=False)
            chunks = moe_triton.REAL_DENSE_CHUNKS  # the dense MLP's weights: contiguous, as loaded
            dense = DenseMlp(
                x, *(contiguous(fake(out, inp, asym)[0]) for out, inp in ((2 * chunks * inter, d), (d, chunks * inter)))
            )
            experts = fake(2 * inter, d, asym), fake(d, inter, asym)
            fused_router_moe(x, *experts, x, router, top_k, scale, summed=False, dense=dense)
    launched = {_launch_key(fn, args, kwargs) for fn, args, kwargs in launches}
    listed = {_key(s.fn, s.signature, s.constexprs, s.num_warps, s.num_stages, s.maxnreg) for s in specs}
    assert launched == listed


@pytest.mark.parametrize(
    "tokens, top_k, experts", [(1, 8, 128), (16, 8, 128), (5, 2, 8), (7, 2, 6), (2, 2, 3), (40, 2, 8)]
)
def test_pairs_grouped_in_one_kernel_as_the_torch_sort_groups_them(tokens, top_k, experts):
    """The one-program counting sort gives `_route`'s order, ranges and experts exactly, the empty
    slots past the distinct experts included (16 tokens x top 8 of 128); over GROUP_PAIRS pairs the
    torch form runs."""
    gen = torch.Generator().manual_seed(tokens * 7 + experts)
    top_idx = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    top_idx[-1] = top_idx[0]  # repeated experts across tokens
    with kernels("triton"):
        got = moe_triton._group_pairs(top_idx, experts)
    for a, b in zip(got, moe_triton._route(top_idx, experts)):
        assert torch.equal(a, b)
    many = torch.randint(0, 128, (moe_triton.GROUP_PAIRS // 8 + 1, 8), generator=gen)
    assert all(torch.equal(a, b) for a, b in zip(moe_triton._group_pairs(many, 128), moe_triton._route(many, 128)))
