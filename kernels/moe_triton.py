"""Fused W4A16 mixture of experts in Triton: the same function as `moe.moe_reference`.

Launches with grids that depend only on shapes (CUDA-graph friendly, no host sync):
0. the grouping of the (token, expert) pairs by expert: for up to GROUP_PAIRS pairs (decode,
   verify) one program, which can also route the tokens first (`fused_routed_moe`), or project
   them on the router, route and group in one kernel (`fused_router_moe`); past that torch's sort.
1. gate_up + GeGLU: one item per (slot, block of I). A slot is one distinct expert hit by the
   call; the (token, expert) pairs are sorted by expert on the device, so a slot owns a contiguous
   range of pairs. The item reads its expert's gate and up tiles and applies them to every pair
   of the slot, BLOCK_M pairs at a time; h = gelu_tanh(gate) * up is stored per pair in x's dtype
   (the reference rounds h to x's dtype too), at the pair's sorted position.
2. down + routing weight: one item per (slot, block of D); y = down_e h times the pair's weight,
   fp32, stored at the pair's original (t, k) position.
   On the small path (decode, verify) both stages are one launch (`moe_small_triton`), and the
   layer's dense GLU MLP can ride along (`dense_chunks`): its intermediate cut into expert-sized
   chunks, each an extra slot after the experts' whose rows are the tokens; its h rows and its
   unweighted fp32 partials follow the pairs', and the norms after the MLPs add the partials in
   chunk order. Each kind of slot runs its own loop (`moe_rows_triton`'s loops) with its strides
   compile-time, so the experts' registers do not change. Prefill runs a kernel per stage.
3. out[t] = sum over k = 0..K-1 of y[t, k] in that fixed order, cast to x's dtype; skipped when
   the caller sums y itself (the model's norms after the MLPs do, in the same order).

Batch invariance (1..16 tokens): the small path uses a fixed BLOCK_M with masked rows and no
tl.dot; each row accumulates x * w elementwise into a [BLOCK_M, BLOCK_N, BLOCK_K] fp32 tile over the
reduction dim in a fixed order and reduces BLOCK_K once at the end, so a row's bits depend only on
its own inputs and the constexpr tile shape, never on how many rows share the tile. Prefill (more
than 16 tokens) uses tl.dot on BLOCK_M = 64 tiles for throughput; it is not batch invariant.

Tiles come from the shapes alone (`tiles`): the real experts' configs (below; the small path's in
moe_small_triton), and for a tiny expert (the CPU test models) the whole matrix as one tile. The
CPU tests run these kernels through Triton's interpreter, which pays per executed op and far more
per nested @triton.jit call, per program: so the int4 decoding and GeGLU are written inline and
the int4 addressing is set up once per program (one nested call a program picks the slot's loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import MAX_REGISTERS, CompileSpec, arrival_counters, interpreted, pdl_options
from flashdesk.kernels.grid_dependency import enter, prefetch_rows
from flashdesk.kernels.int4 import Int4Weight
from flashdesk.kernels.linear import linear
from flashdesk.kernels.linear_triton import small_tiles
from flashdesk.kernels.moe_rows_triton import down_rows, gate_up_rows, tiles, zero_arg
from flashdesk.kernels.moe_small_triton import small_experts, small_specs
from flashdesk.kernels.router_triton import ROUTE_ROWS, route_rows, route_triton

if TYPE_CHECKING:  # the front's type; at run time the front calls this module, not the reverse
    from flashdesk.kernels.moe import DenseMlp

SMALL_T = 16  # up to this many tokens: the batch-invariant path (decode, verify): moe_small_triton

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of prefill's expert kernels for the real experts, none
# spilling on sm_86/89/90/120
LARGE_GATE_UP = (64, 32, 64, 4)  # 8 warps: ptxas held them to 128 registers and spilled on sm_120
LARGE_DOWN = (64, 32, 64, 8)  # (64, 64, ...) spills on triton 3.6 (the GPU machine) when asymmetric
SUM_BLOCK = 256
NUM_STAGES = 2
GROUP_PAIRS = 128  # (token, expert) pairs grouped by one program: 16 tokens x top 8
GROUP_CHUNK = 32
GROUP_WARPS = 4
ROUTER_STAGES = 2  # a router program walks two K steps: the second loads while the first is used


@triton.jit(do_not_specialize=["T"])
def _gate_up_kernel(
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    pair_ptr,
    slot_begin_ptr,
    slot_end_ptr,
    slot_expert_ptr,
    h_ptr,
    T,
    D: tl.constexpr,
    I: tl.constexpr,
    GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """h[pair] = gelu_tanh(gate_e x) * up_e x for one slot's pairs and one block of I (prefill)."""
    enter(PDL)
    slot = tl.program_id(0)
    expert = tl.load(slot_expert_ptr + slot).to(tl.int64)
    gate_up_rows(
        x_ptr,
        packed_ptr + expert * (2 * I * (D // 8)),
        scale_ptr + expert * (2 * I * (D // GROUP)),
        zero_ptr + expert * (2 * I * (D // GROUP)),
        pair_ptr,
        h_ptr,
        tl.load(slot_begin_ptr + slot),
        tl.load(slot_end_ptr + slot),
        tl.program_id(1),
        D,
        I,
        GROUP,
        TOP_K,
        I,
        False,
        HAS_ZERO,
        USE_DOT,
        DOT_FP32,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )


@triton.jit(do_not_specialize=["T"])
def _down_kernel(
    h_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    pair_ptr,
    weight_ptr,
    slot_begin_ptr,
    slot_end_ptr,
    slot_expert_ptr,
    y_ptr,
    T,
    D: tl.constexpr,
    I: tl.constexpr,
    GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """y[pair] = weight[pair] * down_e h[pair] (fp32) for one slot's pairs and one block of D (prefill)."""
    enter(PDL)
    slot = tl.program_id(0)
    expert = tl.load(slot_expert_ptr + slot).to(tl.int64)
    down_rows(
        h_ptr,
        packed_ptr + expert * (D * (I // 8)),
        scale_ptr + expert * (D * (I // GROUP)),
        zero_ptr + expert * (D * (I // GROUP)),
        pair_ptr,
        weight_ptr,
        y_ptr,
        tl.load(slot_begin_ptr + slot),
        tl.load(slot_end_ptr + slot),
        tl.program_id(1),
        D,
        I,
        GROUP,
        I,
        False,
        HAS_ZERO,
        USE_DOT,
        DOT_FP32,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )


@triton.jit
def _sum_top_k_kernel(
    y_ptr, out_ptr, D: tl.constexpr, TOP_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """out[t] = y[t, 0] + y[t, 1] + ... + y[t, K-1] in that order, cast to out's dtype."""
    enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = n < D
    acc = tl.load(y_ptr + t * TOP_K * D + n, mask=mask, other=0.0)
    for k in tl.static_range(1, TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + k) * D + n, mask=mask, other=0.0)
    tl.store(out_ptr + t * D + n, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["P", "SLOTS"])
def _group_pairs_kernel(
    idx_ptr,
    order_ptr,
    begin_ptr,
    end_ptr,
    expert_ptr,
    P,
    SLOTS,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)
    group_pairs(idx_ptr, order_ptr, begin_ptr, end_ptr, expert_ptr, P, SLOTS, E, BLOCK_E, BLOCK_P, CHUNK)


@triton.jit
def _route_and_group(
    logits_ptr,
    scale_ptr,
    w_ptr,
    idx_ptr,
    order_ptr,
    begin_ptr,
    end_ptr,
    expert_ptr,
    T,
    SLOTS,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    ROUTE_ROWS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
    ONE_TOKEN: tl.constexpr,
):
    """Every token's top-k (router_triton.route_rows, ROUTE_ROWS tokens a step, each row reduced
    on its own whatever its place in the tile), then, once the whole program has stored them, the
    grouping by expert; ONE_TOKEN (a decode step, T = 1) by rank (`rank_pairs`)."""
    for t0 in range(0, T, ROUTE_ROWS):
        route_rows(logits_ptr, scale_ptr, w_ptr, idx_ptr, t0 + tl.arange(0, ROUTE_ROWS), T, E, TOP_K, BLOCK_E, BLOCK_K)
    tl.debug_barrier()  # the ids each thread stored are read back by others
    if ONE_TOKEN:
        rank_pairs(idx_ptr, order_ptr, begin_ptr, end_ptr, expert_ptr, TOP_K, BLOCK_K)
    else:
        group_pairs(idx_ptr, order_ptr, begin_ptr, end_ptr, expert_ptr, T * TOP_K, SLOTS, E, BLOCK_E, BLOCK_P, CHUNK)


@triton.jit
def rank_pairs(idx_ptr, order_ptr, begin_ptr, end_ptr, expert_ptr, P, BLOCK_K: tl.constexpr):
    """`group_pairs` of one token's P <= BLOCK_K pairs: its top-k experts are distinct, so each is
    a slot of one pair, and a pair's place in expert order is its expert's rank among them (the
    counting sort's [32 x 128] tiles cost ~1,000 SASS instructions a warp more)."""
    k = tl.arange(0, BLOCK_K)
    ok = k < P
    ex = tl.load(idx_ptr + k, mask=ok, other=0).to(tl.int32)
    rank = tl.sum(((ex[None, :] < ex[:, None]) & ok[None, :]).to(tl.int32), 1)
    tl.store(order_ptr + rank, k, mask=ok)
    tl.store(begin_ptr + rank, rank, mask=ok)
    tl.store(end_ptr + rank, rank + 1, mask=ok)
    tl.store(expert_ptr + rank, ex, mask=ok)


@triton.jit(do_not_specialize=["T", "SLOTS"])  # not T: one compile for decode (ONE_TOKEN), one for blocks
def _route_group_kernel(
    logits_ptr,
    scale_ptr,
    w_ptr,
    idx_ptr,
    order_ptr,
    begin_ptr,
    end_ptr,
    expert_ptr,
    T,
    SLOTS,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    ROUTE_ROWS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
    ONE_TOKEN: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """A decode or verify block's routing and pair grouping in one program (a router whose logits
    come from elsewhere: `_router_kernel` computes them too)."""
    enter(PDL)
    _route_and_group(
        logits_ptr,
        scale_ptr,
        w_ptr,
        idx_ptr,
        order_ptr,
        begin_ptr,
        end_ptr,
        expert_ptr,
        T,
        SLOTS,
        E,
        TOP_K,
        ROUTE_ROWS,
        BLOCK_E,
        BLOCK_K,
        BLOCK_P,
        CHUNK,
        ONE_TOKEN,
    )


@triton.jit(do_not_specialize=["T", "SLOTS"])
def _router_kernel(
    x_ptr,
    router_ptr,
    part_ptr,
    count_ptr,
    logits_ptr,
    scale_ptr,
    w_ptr,
    idx_ptr,
    order_ptr,
    begin_ptr,
    end_ptr,
    expert_ptr,
    T,
    SLOTS,
    D: tl.constexpr,
    E: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    TOP_K: tl.constexpr,
    ROUTE_ROWS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
    ONE_TOKEN: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """A decode or verify block's router: program s projects the block's T <= BLOCK_T rows on
    columns s * K_CHUNK.. of the router weight [E, D] (a BLOCK_T-row tensor-core tile: rows never
    mix) into an fp32 partial; the last program to finish (count_ptr: zero between launches) adds
    the partials in chunk order, rounds the logits to x's dtype, then routes and groups the pairs.
    The tiles and the order are the linear kernel's for this weight (linear_triton.small_tiles),
    so the logits are the bits `linear` gives: one launch where there were two."""
    s = tl.program_id(0)
    t = tl.arange(0, BLOCK_T)
    e = tl.arange(0, BLOCK_E)
    rows = router_ptr + tl.minimum(e, E - 1)[:, None] * D  # rows past E read row E - 1, never stored
    AHEAD: tl.constexpr = K_CHUNK if K_CHUNK < 2 * BLOCK_D else 2 * BLOCK_D  # columns prefetched: two steps
    w_bytes: tl.constexpr = router_ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_rows(rows, s * K_CHUNK * w_bytes, AHEAD * w_bytes, D * w_bytes, PDL)
    enter(PDL)  # the router weight is never written by the step: prefetched before the wait
    dot_ty = tl.float32 if DOT_FP32 else x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_T, BLOCK_E), tl.float32)
    for k0 in range(s * K_CHUNK, tl.minimum(s * K_CHUNK + K_CHUNK, D), BLOCK_D):
        k = k0 + tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + t[:, None] * D + k[None, :], mask=(t < T)[:, None] & (k < D)[None, :], other=0.0)
        w = tl.load(rows + k[None, :], mask=(k < D)[None, :], other=0.0)
        acc = tl.dot(x.to(dot_ty), tl.trans(w.to(dot_ty)), acc, input_precision="ieee")
    at = t[:, None] * E + e[None, :]
    ok = (t < T)[:, None] & (e < E)[None, :]
    tl.store(part_ptr + s * T * E + at, acc, mask=ok)
    tl.debug_barrier()  # all of this program's partial is written before the release below
    if tl.atomic_add(count_ptr, 1, sem="acq_rel") == SPLIT - 1:  # the others' partials are visible
        total = tl.load(part_ptr + at, mask=ok, other=0.0, cache_modifier=".cg")
        for j in range(1, SPLIT):  # chunk order, the same bits whichever program came last
            total += tl.load(part_ptr + j * T * E + at, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(logits_ptr + at, total.to(logits_ptr.dtype.element_ty), mask=ok)
        tl.atomic_xchg(count_ptr, 0, sem="relaxed")  # the next launch starts from zero
        tl.debug_barrier()  # the logits each thread stored are read back by others
        _route_and_group(
            logits_ptr,
            scale_ptr,
            w_ptr,
            idx_ptr,
            order_ptr,
            begin_ptr,
            end_ptr,
            expert_ptr,
            T,
            SLOTS,
            E,
            TOP_K,
            ROUTE_ROWS,
            BLOCK_E,
            BLOCK_K,
            BLOCK_P,
            CHUNK,
            ONE_TOKEN,
        )


@triton.jit
def group_pairs(
    idx_ptr,
    order_ptr,
    begin_ptr,
    end_ptr,
    expert_ptr,
    P,
    SLOTS,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """`_route` for up to BLOCK_P pairs in one program: a stable counting sort by expert, CHUNK
    pairs at a time (whole [pairs x experts] tiles would not fit the registers)."""
    e = tl.arange(0, BLOCK_E)
    p = tl.arange(0, BLOCK_P)
    every = tl.load(idx_ptr + p, mask=p < P, other=E).to(tl.int32)
    count = tl.zeros([BLOCK_E], tl.int32)  # pairs per expert
    for c in range(0, P, CHUNK):  # the chunks that hold pairs (a decode step's 8: one)
        q = c + tl.arange(0, CHUNK)
        ex = tl.load(idx_ptr + q, mask=q < P, other=E).to(tl.int32)
        count += tl.sum(((ex[None, :] == e[:, None]) & (q < P)[None, :]).to(tl.int32), 1)
    before = tl.cumsum(count, 0) - count  # where each expert's run begins in expert order
    present = (count > 0).to(tl.int32)
    slot = tl.cumsum(present, 0) - present  # each present expert's slot
    for c in range(0, P, CHUNK):  # the chunks that hold pairs (a decode step's 8: one)
        # a pair's place: its expert's run start + the earlier pairs of the same expert (stable)
        q = c + tl.arange(0, CHUNK)
        ex = tl.load(idx_ptr + q, mask=q < P, other=E).to(tl.int32)
        run_start = tl.sum(tl.where(ex[:, None] == e[None, :], before[None, :], 0), 1)
        same_before = tl.sum(((every[None, :] == ex[:, None]) & (p[None, :] < q[:, None])).to(tl.int32), 1)
        tl.store(order_ptr + run_start + same_before, q, mask=q < P)
    # slots past the distinct experts: an empty range at the end, the last expert (as _route has)
    empty = (e >= tl.sum(present, 0)) & (e < SLOTS)
    none = e * 0
    tl.store(begin_ptr + e, none + P, mask=empty)
    tl.store(end_ptr + e, none + P, mask=empty)
    tl.store(expert_ptr + e, none + tl.max(tl.where(p < P, every, 0), 0), mask=empty)
    tl.store(begin_ptr + slot, before, mask=present > 0)
    tl.store(end_ptr + slot, before + count, mask=present > 0)
    tl.store(expert_ptr + slot, e, mask=present > 0)


def _group_pairs(top_idx: torch.Tensor, n_experts: int):
    """What `_route` returns, from one kernel when the pairs fit GROUP_PAIRS (decode and verify)."""
    flat = top_idx.reshape(-1).contiguous()
    n_pairs, slots = flat.numel(), min(n_experts, flat.numel())
    if n_pairs > GROUP_PAIRS or n_experts > GROUP_PAIRS:
        return _route(top_idx, n_experts)
    order = torch.empty(n_pairs, dtype=torch.int32, device=flat.device)
    begin, end, expert = (torch.empty(slots, dtype=torch.int32, device=flat.device) for _ in range(3))
    _group_pairs_kernel[(1,)](
        flat,
        order,
        begin,
        end,
        expert,
        n_pairs,
        slots,
        E=n_experts,
        BLOCK_E=triton.next_power_of_2(n_experts),
        BLOCK_P=GROUP_PAIRS,
        CHUNK=GROUP_CHUNK,
        num_warps=GROUP_WARPS,
        num_stages=NUM_STAGES,
        **pdl_options(flat.device),
    )
    return order, begin, end, expert


def _route(top_idx: torch.Tensor, n_experts: int):
    """Group the (token, expert) pairs by expert on the device, without a host sync.

    Returns pair ids in expert order, and per slot s < min(E, T*K): its pair range [begin, end)
    in that order and its expert; slots past the number of distinct experts get begin = end.
    """
    flat = top_idx.reshape(-1)
    n_pairs = flat.numel()
    experts, order = torch.sort(flat, stable=True)
    new = torch.ones_like(experts, dtype=torch.bool)
    new[1:] = experts[1:] != experts[:-1]
    slot_of = torch.cumsum(new, 0) - 1  # nondecreasing slot index of each sorted pair
    slots = torch.arange(min(n_experts, n_pairs), device=flat.device, dtype=slot_of.dtype)
    begin = torch.searchsorted(slot_of, slots)
    end = torch.searchsorted(slot_of, slots, right=True)
    expert = experts[begin.clamp(max=n_pairs - 1)]
    return [t.to(torch.int32) for t in (order, begin, end, expert)]


def fused_moe(
    x: torch.Tensor,
    gate_up: Int4Weight,
    down: Int4Weight,
    top_idx: torch.Tensor,
    top_w: torch.Tensor,
    summed: bool = True,
    dense: DenseMlp | None = None,
):
    """x [T, D], gate_up [E, 2I, D], down [E, D, I] int4, top_idx/top_w [T, K] -> [T, D] in x's
    dtype; summed=False skips the third launch and returns the weighted pair outputs [T, K, D] fp32.
    With a `dense` MLP that fits (dense_chunks), (that, its per-chunk partials): see _experts."""
    n_tokens, top_k = top_idx.shape
    if n_tokens == 0:
        return _nothing(x, top_k, summed)
    grouping = _group_pairs(top_idx, gate_up.shape[0])
    weight = top_w.reshape(-1).to(torch.float32).contiguous()
    return _experts(x, gate_up, down, weight, top_k, grouping, summed, dense)


def fused_routed_moe(
    x: torch.Tensor,
    gate_up: Int4Weight,
    down: Int4Weight,
    logits: torch.Tensor,
    top_k: int,
    per_expert_scale: torch.Tensor,
    summed: bool = True,
    dense: DenseMlp | None = None,
):
    """router.route of the router's logits [T, E], then fused_moe. When one program groups the
    block's pairs (decode, verify) it routes them first: one launch instead of two."""
    n_tokens, n_experts = logits.shape
    n_pairs, slots = n_tokens * top_k, min(n_experts, n_tokens * top_k)
    if not n_tokens or n_pairs > GROUP_PAIRS or n_experts > GROUP_PAIRS or not 0 < top_k <= n_experts:
        top_w, top_idx = route_triton(logits, top_k, per_expert_scale)  # (it refuses a bad top_k)
        return fused_moe(x, gate_up, down, top_idx, top_w, summed, dense)
    device = logits.device
    weight = torch.empty(n_pairs, dtype=torch.float32, device=device)
    ids, order = (torch.empty(n_pairs, dtype=torch.int32, device=device) for _ in range(2))
    begin, end, expert = (torch.empty(slots, dtype=torch.int32, device=device) for _ in range(3))
    _route_group_kernel[(1,)](
        logits.contiguous(),
        per_expert_scale,
        weight,
        ids,
        order,
        begin,
        end,
        expert,
        n_tokens,
        slots,
        E=n_experts,
        TOP_K=top_k,
        ROUTE_ROWS=ROUTE_ROWS,
        BLOCK_E=triton.next_power_of_2(n_experts),
        BLOCK_K=triton.next_power_of_2(top_k),
        BLOCK_P=GROUP_PAIRS,
        CHUNK=GROUP_CHUNK,
        ONE_TOKEN=n_tokens == 1,
        num_warps=GROUP_WARPS,
        num_stages=NUM_STAGES,
        maxnreg=MAX_REGISTERS,
        **pdl_options(logits.device),
    )
    return _experts(x, gate_up, down, weight, top_k, (order, begin, end, expert), summed, dense)


def _router_launch(router_x: torch.Tensor, router, top_k: int):
    """The router kernel's tiles (the linear kernel's for this weight) for a dense router on a
    decode or verify block that one program groups; None where the kernel does not apply."""
    if not isinstance(router, torch.Tensor):
        return None
    n_tokens, n_experts = router_x.shape[0], router.shape[0]
    if not (
        0 < n_tokens <= SMALL_T
        and 0 < top_k <= n_experts
        and n_tokens * top_k <= GROUP_PAIRS
        and n_experts <= GROUP_PAIRS
    ):
        return None
    return small_tiles(n_experts, router.shape[1], None)


def fused_router_moe(
    x: torch.Tensor,
    gate_up: Int4Weight,
    down: Int4Weight,
    router_x: torch.Tensor,
    router,
    top_k: int,
    per_expert_scale: torch.Tensor,
    summed: bool = True,
    dense: DenseMlp | None = None,
):
    """The router's logits linear(router_x, router), their routing, then fused_moe. For a dense
    router on a decode or verify block the projection, the routing and the grouping of the pairs
    are one kernel (`_router_kernel`); otherwise `linear`, then fused_routed_moe."""
    tiles = _router_launch(router_x, router, top_k)
    if tiles is None:
        logits = linear(router_x, router)
        return fused_routed_moe(x, gate_up, down, logits, top_k, per_expert_scale, summed, dense)
    n_tokens, (n_experts, d) = router_x.shape[0], router.shape
    if router_x.shape[1] != d:
        raise ValueError(f"router input {tuple(router_x.shape)} does not match a router of {d} inputs")
    n_pairs, slots, device = n_tokens * top_k, min(n_experts, n_tokens * top_k), x.device
    part = torch.empty((tiles.split, n_tokens, n_experts), dtype=torch.float32, device=device)
    logits = torch.empty((n_tokens, n_experts), dtype=router_x.dtype, device=device)
    weight = torch.empty(n_pairs, dtype=torch.float32, device=device)
    ids, order = (torch.empty(n_pairs, dtype=torch.int32, device=device) for _ in range(2))
    begin, end, expert = (torch.empty(slots, dtype=torch.int32, device=device) for _ in range(3))
    _router_kernel[(tiles.split,)](
        router_x.contiguous(),
        router.contiguous(),
        part,
        arrival_counters(device),
        logits,
        per_expert_scale,
        weight,
        ids,
        order,
        begin,
        end,
        expert,
        n_tokens,
        slots,
        **_router_constexprs(n_experts, d, top_k, tiles, n_tokens == 1),
        DOT_FP32=interpreted(),
        num_warps=tiles.num_warps,
        num_stages=ROUTER_STAGES,
        maxnreg=MAX_REGISTERS,
        **pdl_options(device),
    )
    return _experts(x, gate_up, down, weight, top_k, (order, begin, end, expert), summed, dense)


def _router_constexprs(n_experts: int, d: int, top_k: int, tiles, one_token: bool) -> dict:
    return dict(
        D=d,
        E=n_experts,
        K_CHUNK=tiles.k_chunk,
        SPLIT=tiles.split,
        TOP_K=top_k,
        ROUTE_ROWS=ROUTE_ROWS,
        BLOCK_T=tiles.block_m,
        BLOCK_E=max(16, triton.next_power_of_2(n_experts)),
        BLOCK_D=tiles.block_k,
        BLOCK_K=triton.next_power_of_2(top_k),
        BLOCK_P=GROUP_PAIRS,
        CHUNK=GROUP_CHUNK,
        ONE_TOKEN=one_token,
    )


def _nothing(x: torch.Tensor, top_k: int, summed: bool) -> torch.Tensor:
    return torch.empty_like(x) if summed else torch.empty(0, top_k, x.shape[1], device=x.device, dtype=torch.float32)


def dense_chunks(dense: DenseMlp | None, x: torch.Tensor, gate_up: Int4Weight, down: Int4Weight) -> int:
    """How many expert-sized chunks the dense MLP runs as in the expert kernels (0: it cannot).

    It can on the small path (x: the experts' input rows) when its input matches x's rows, dtype
    and device, its weights are contiguous int4 in the experts' format (group size, zero points,
    scale dtype), and its intermediate is a whole number of expert intermediates, each a whole
    number of down groups and words: Gemma 4 26B-A4B's 2,112 is three of 704. Its two launches a
    layer then disappear."""
    if dense is None or not 0 < x.shape[0] <= SMALL_T:
        return 0
    if not (isinstance(dense.gate_up, Int4Weight) and isinstance(dense.down, Int4Weight)):
        return 0
    weights = (gate_up, down, dense.gate_up, dense.down)
    _, two_i, d = gate_up.shape
    inter = two_i // 2
    formats = {(w.group_size, w.zero is None, w.scale.dtype) for w in weights}
    parts = [t for w in (dense.gate_up, dense.down) for t in (w.packed, w.scale, w.zero) if t is not None]
    same_input = (dense.x.shape, dense.x.dtype, dense.x.device) == (x.shape, x.dtype, x.device)
    if len(formats) != 1 or not same_input or not all(t.is_contiguous() for t in parts):
        return 0
    if inter % down.group_size or inter % 8 or dense.down.shape[-1] % inter:
        return 0
    chunks = dense.down.shape[-1] // inter
    shapes = tuple(dense.gate_up.shape) == (2 * chunks * inter, d) and tuple(dense.down.shape) == (d, chunks * inter)
    return chunks if shapes else 0


def _experts(
    x: torch.Tensor,
    gate_up: Int4Weight,
    down: Int4Weight,
    weight: torch.Tensor,
    top_k: int,
    grouping: tuple,
    summed: bool,
    dense: DenseMlp | None = None,
):
    """The expert launches on pairs already grouped by expert (order, begin, end, expert), with
    their routing weights [T * K] fp32; T > 0. With a `dense` MLP that fits (`dense_chunks`) its
    chunks run as extra slots of the same launch, and the result is (the experts' output, the
    dense MLP's per-chunk fp32 partials [S, T, D]): summed in chunk order and rounded they are its
    output (mlp_out_norms does that)."""
    n_tokens = x.shape[0]
    d = gate_up.shape[2]
    x = x.contiguous()
    chunks = dense_chunks(dense, x, gate_up, down)
    if n_tokens <= SMALL_T:
        y = small_experts(x, gate_up, down, weight, top_k, grouping, dense, chunks)
    else:
        y = _large_experts(x, gate_up, down, weight, top_k, grouping)
    partials = y[n_tokens * top_k :].view(chunks, n_tokens, d)
    y = y[: n_tokens * top_k]
    if summed:
        out = torch.empty(n_tokens, d, device=x.device, dtype=x.dtype)
        _sum_top_k_kernel[(n_tokens, triton.cdiv(d, SUM_BLOCK))](
            y, out, D=d, TOP_K=top_k, BLOCK=SUM_BLOCK, num_warps=4, num_stages=NUM_STAGES, **pdl_options(y.device)
        )
    else:
        out = y.view(n_tokens, top_k, d)
    return (out, partials) if chunks else out


def _large_experts(
    x: torch.Tensor, gate_up: Int4Weight, down: Int4Weight, weight: torch.Tensor, top_k: int, grouping: tuple
) -> torch.Tensor:
    """The weighted pair outputs y [T * K, D] fp32 of more than SMALL_T tokens: two launches."""
    n_tokens = x.shape[0]
    _, two_i, d = gate_up.shape
    inter = two_i // 2
    pairs, begin, end, expert = grouping
    common = dict(USE_DOT=True, DOT_FP32=interpreted() or x.dtype == torch.float32, TOP_K=top_k)
    common |= pdl_options(x.device)
    bm, bn, bk, warps = tiles(LARGE_GATE_UP, inter, d, False)
    h = torch.empty(n_tokens * top_k, inter, device=x.device, dtype=x.dtype)
    _gate_up_kernel[(begin.numel(), triton.cdiv(inter, bn))](
        x,
        gate_up.packed,
        gate_up.scale,
        zero_arg(gate_up),
        pairs,
        begin,
        end,
        expert,
        h,
        n_tokens,
        D=d,
        I=inter,
        GROUP=gate_up.group_size,
        HAS_ZERO=gate_up.zero is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=warps,
        num_stages=NUM_STAGES,
        **common,
    )
    bm, bn, bk, warps = tiles(LARGE_DOWN, d, inter, False)
    y = torch.empty(n_tokens * top_k, d, device=x.device, dtype=torch.float32)
    _down_kernel[(begin.numel(), triton.cdiv(d, bn))](
        h,
        down.packed,
        down.scale,
        zero_arg(down),
        pairs,
        weight,
        begin,
        end,
        expert,
        y,
        n_tokens,
        D=d,
        I=inter,
        GROUP=down.group_size,
        HAS_ZERO=down.zero is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=warps,
        num_stages=NUM_STAGES,
        **common,
    )
    return y


# Real shapes: Gemma 4 26B-A4B experts, bf16 activations, int4 group 32.
REAL_D, REAL_I, REAL_TOP_K, REAL_GROUP, REAL_EXPERTS = 2816, 704, 8, 32, 128
REAL_DENSE_CHUNKS = 3  # the dense MLP's intermediate, 2,112, is three experts' 704


def compile_specs() -> list[CompileSpec]:
    """Every specialization fused_moe launches for the real model: both paths, sym and asym."""
    specs = small_specs(REAL_D, REAL_I, REAL_GROUP, REAL_TOP_K, REAL_DENSE_CHUNKS)
    pointers = {
        "packed_ptr": "*i32",
        "scale_ptr": "*bf16",
        "pair_ptr": "*i32",
        "slot_begin_ptr": "*i32",
        "slot_end_ptr": "*i32",
        "slot_expert_ptr": "*i32",
        "T": "i32",
    }
    for has_zero in (False, True):  # prefill's two kernels
        zero = "*i8" if has_zero else "*i32"
        flags = dict(GROUP=REAL_GROUP, HAS_ZERO=has_zero, USE_DOT=True, DOT_FP32=False, D=REAL_D, I=REAL_I)
        flags |= dict(TOP_K=REAL_TOP_K)
        kind = "asym" if has_zero else "sym"
        bm, bn, bk, warps = tiles(LARGE_GATE_UP, REAL_I, REAL_D, False)
        sig = {"x_ptr": "*bf16", **pointers, "zero_ptr": zero, "h_ptr": "*bf16"}
        consts = dict(flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        specs.append(_spec(f"moe_gate_up_large_{kind}", _gate_up_kernel, sig, consts, warps))
        bm, bn, bk, warps = tiles(LARGE_DOWN, REAL_D, REAL_I, False)
        sig = {"h_ptr": "*bf16", **pointers, "zero_ptr": zero, "weight_ptr": "*fp32", "y_ptr": "*fp32"}
        consts = dict(flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        specs.append(_spec(f"moe_down_large_{kind}", _down_kernel, sig, consts, warps))
    specs.append(
        _spec(
            "moe_sum_top_k",
            _sum_top_k_kernel,
            {"y_ptr": "*fp32", "out_ptr": "*bf16"},
            dict(D=REAL_D, TOP_K=REAL_TOP_K, BLOCK=SUM_BLOCK),
            4,
        )
    )
    routing = {  # the routing's and grouping's arguments
        "logits_ptr": "*bf16",
        "scale_ptr": "*bf16",
        "w_ptr": "*fp32",
        "idx_ptr": "*i32",
        "order_ptr": "*i32",
        "begin_ptr": "*i32",
        "end_ptr": "*i32",
        "expert_ptr": "*i32",
        "T": "i32",
        "SLOTS": "i32",
    }
    for one_token in (True, False):  # a decode step's one token, a verify block's
        specs.append(
            CompileSpec(
                f"moe_route_group_pairs[top 8{', one token' if one_token else ''}]",
                _route_group_kernel,
                {
                    **routing,
                    **dict.fromkeys(
                        ("E", "TOP_K", "ROUTE_ROWS", "BLOCK_E", "BLOCK_K", "BLOCK_P", "CHUNK", "ONE_TOKEN"), "constexpr"
                    ),
                },
                {
                    "E": REAL_EXPERTS,
                    "TOP_K": REAL_TOP_K,
                    "ROUTE_ROWS": ROUTE_ROWS,
                    "BLOCK_E": REAL_EXPERTS,
                    "BLOCK_K": REAL_TOP_K,
                    "BLOCK_P": GROUP_PAIRS,
                    "CHUNK": GROUP_CHUNK,
                    "ONE_TOKEN": one_token,
                },
                num_warps=GROUP_WARPS,
                num_stages=NUM_STAGES,
                maxnreg=MAX_REGISTERS,
            )
        )
    router_tiles = small_tiles(REAL_EXPERTS, REAL_D, None)
    for one_token in (True, False):
        specs.append(
            _spec(
                f"moe_router[E=128,top 8{', one token' if one_token else ''}]",
                _router_kernel,
                {"x_ptr": "*bf16", "router_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", **routing},
                dict(_router_constexprs(REAL_EXPERTS, REAL_D, REAL_TOP_K, router_tiles, one_token), DOT_FP32=False),
                router_tiles.num_warps,
                ROUTER_STAGES,
                MAX_REGISTERS,
            )
        )
    specs.append(
        CompileSpec(
            "moe_group_pairs",
            _group_pairs_kernel,
            {
                "idx_ptr": "*i64",
                "order_ptr": "*i32",
                "begin_ptr": "*i32",
                "end_ptr": "*i32",
                "expert_ptr": "*i32",
                "P": "i32",
                "SLOTS": "i32",
                "E": "constexpr",
                "BLOCK_E": "constexpr",
                "BLOCK_P": "constexpr",
                "CHUNK": "constexpr",
            },
            {"E": REAL_EXPERTS, "BLOCK_E": REAL_EXPERTS, "BLOCK_P": GROUP_PAIRS, "CHUNK": GROUP_CHUNK},
            num_warps=GROUP_WARPS,
            num_stages=NUM_STAGES,
        )
    )
    return specs


def _spec(name, fn, pointer_sig, consts, warps, stages=NUM_STAGES, maxnreg=None) -> CompileSpec:
    """A CompileSpec with the signature in the kernel's argument order, constexprs marked."""
    sig = {arg: pointer_sig[arg] if arg in pointer_sig else "constexpr" for arg in fn.arg_names}
    return CompileSpec(name, fn, sig, consts, num_warps=warps, num_stages=stages, maxnreg=maxnreg)


def tail(launch: dict) -> tuple[CompileSpec, int]:
    """What the router's last program runs after the others, for the performance model: the
    routing and grouping of the block's tokens (the same code as the one-program kernel), once a
    ROUTE_ROWS tokens (a block's routing and grouping loops run about that often)."""
    one_token = bool(launch["constexprs"].get("ONE_TOKEN"))
    name = f"moe_route_group_pairs[top 8{', one token' if one_token else ''}]"
    passes = triton.cdiv(launch.get("scalars", {}).get("T", 1), ROUTE_ROWS)
    return next(spec for spec in compile_specs() if spec.name == name), passes


TAILS = {"_router_kernel": tail}  # kernel -> its tail, for engine/bench/step_launches.py
# kernel -> the weights it asks L2 for whole before its wait, for engine/bench/step_launches.py: the
# router's two K steps are its whole chunk
PREFETCHED = {"_router_kernel": ("router_ptr",)}
