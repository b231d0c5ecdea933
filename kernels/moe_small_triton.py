"""The small path's experts (1..16 tokens: decode and verify blocks) in one launch.

The gate/up + GeGLU items of every slot come first, then the down items: an item is one block of
one slot's outputs, named by a ticket (`work_tickets`), not by the program id. A slot's down items
wait on its counter until its gate/up items have counted in, then read h past L1. At decode that is
one launch a layer fewer than a gate/up kernel and a down kernel: no launch gap at the handover,
and the down items start while the slowest gate/up items drain (a down item reads its weights only
once its slot is done; most find it done, coming after every gate/up item in ticket order).

Each item runs the loop its own kernel would (`moe_rows_triton`), with the same tiles and warps
for every token count of the path, so decode and verify rows stay bit for bit the same (batch
invariance). Both kinds run 2 warps, one launch's: at 4 warps the down loop took more registers
than at 2 (153 against 127 on sm_90), and 3 blocks an SM kept 20 KiB in flight; at 2 warps 6
blocks keep 40 KiB (kernels.check --perf).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import ARRIVAL_COUNTERS, CompileSpec, arrival_counters, pdl_options
from flashdesk.kernels.grid_dependency import enter, prefetch_rows
from flashdesk.kernels.int4 import Int4Weight
from flashdesk.kernels.moe_rows_triton import down_rows, gate_up_rows, tiles, zero_arg
from flashdesk.kernels.work_tickets import count_in, take, wait_count

if TYPE_CHECKING:  # the front's type; at run time the front calls this module, not the reverse
    from flashdesk.kernels.moe import DenseMlp

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of the real experts' items. BLOCK_M is 4, not 16: at decode
# every slot holds one pair and at verify a few, so a 16-row tile would spend 4-16x the FMAs (and
# registers) on masked rows; a slot with more pairs loops over row tiles, re-reading its weight tile
# from L2. Untuned: no GPU was at hand.
SMALL_GATE_UP = (4, 8, 64, 2)
SMALL_DOWN = (4, 16, 64, 2)
NUM_STAGES = 2
# counters: [0] the tickets, [1] the down items done, [2 + slot] a slot's gate/up items done
FIRST_SLOT_COUNTER = tl.constexpr(2)
RESET_BLOCK = tl.constexpr(ARRIVAL_COUNTERS)  # counters the last item may zero


@triton.jit
def _prefetch_dense_rows(
    packed_ptr,
    scale_ptr,
    zero_ptr,
    chunk,
    block,
    D: tl.constexpr,
    I: tl.constexpr,
    GROUP: tl.constexpr,
    DENSE: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """Before the wait: the gate and up rows (and their scales) of dense chunk `chunk`'s block
    `block` of I, whole. Whichever program takes that item finds them in L2."""
    gate = tl.minimum(chunk * I + block * BLOCK_N + tl.arange(0, BLOCK_N), (chunk + 1) * I - 1)[:, None]
    up = gate + DENSE * I  # the up rows, DENSE * I below the gate rows
    s_bytes: tl.constexpr = scale_ptr.dtype.element_ty.primitive_bitwidth // 8 * (D // GROUP)
    z_bytes: tl.constexpr = zero_ptr.dtype.element_ty.primitive_bitwidth // 8 * (D // GROUP)
    prefetch_rows(packed_ptr + gate * (D // 8), 0, D // 2, D // 2, PDL)
    prefetch_rows(packed_ptr + up * (D // 8), 0, D // 2, D // 2, PDL)
    prefetch_rows(scale_ptr + gate * (D // GROUP), 0, s_bytes, s_bytes, PDL)
    prefetch_rows(scale_ptr + up * (D // GROUP), 0, s_bytes, s_bytes, PDL)
    if HAS_ZERO:
        prefetch_rows(zero_ptr + gate * (D // GROUP), 0, z_bytes, z_bytes, PDL)
        prefetch_rows(zero_ptr + up * (D // GROUP), 0, z_bytes, z_bytes, PDL)


@triton.jit(do_not_specialize=["T"])
def _experts_kernel(
    x_ptr,
    gate_up_packed_ptr,
    gate_up_scale_ptr,
    gate_up_zero_ptr,
    down_packed_ptr,
    down_scale_ptr,
    down_zero_ptr,
    pair_ptr,
    weight_ptr,
    slot_begin_ptr,
    slot_end_ptr,
    slot_expert_ptr,
    h_ptr,
    y_ptr,
    dense_x_ptr,
    dense_gate_up_packed_ptr,
    dense_gate_up_scale_ptr,
    dense_gate_up_zero_ptr,
    dense_down_packed_ptr,
    dense_down_scale_ptr,
    dense_down_zero_ptr,
    count_ptr,
    T,
    D: tl.constexpr,
    I: tl.constexpr,
    UP_GROUP: tl.constexpr,
    DOWN_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    UP_ZERO: tl.constexpr,
    DOWN_ZERO: tl.constexpr,
    BLOCK_M: tl.constexpr,
    UP_N: tl.constexpr,
    UP_K: tl.constexpr,
    DOWN_N: tl.constexpr,
    DOWN_K: tl.constexpr,
    DENSE: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """h[pair] = gelu_tanh(gate_e x) * up_e x, then y[pair] = weight[pair] * down_e h[pair] (fp32),
    over every slot; the last DENSE slots are the dense MLP's chunks: chunk j's h rows T * TOP_K
    + j * T.. from the dense [gate; up] rows j * I.. over dense_x, and its unweighted partial into
    y rows T * TOP_K + j * T.. The grid is (expert slots + DENSE) x (UP_BLOCKS + DOWN_BLOCKS)
    programs, one item each; in ticket order the gate/up items, then the down items, each stage's
    dense chunks first (their inputs are ready first). count_ptr: zero between launches
    (backend.arrival_counters)."""
    UP_BLOCKS: tl.constexpr = (I + UP_N - 1) // UP_N
    DOWN_BLOCKS: tl.constexpr = (D + DOWN_N - 1) // DOWN_N
    every = tl.num_programs(0) // (UP_BLOCKS + DOWN_BLOCKS)  # slots, the dense chunks' included
    slots = every - DENSE
    up_items = every * UP_BLOCKS
    # the dense chunks' items come first and their weights need no routing: program i asks L2 for
    # item i's if it is one of them (the first programs are the first resident)
    if DENSE:
        pid = tl.program_id(0)
        if pid < DENSE * UP_BLOCKS:
            _prefetch_dense_rows(
                dense_gate_up_packed_ptr,
                dense_gate_up_scale_ptr,
                dense_gate_up_zero_ptr,
                pid // UP_BLOCKS,
                pid % UP_BLOCKS,
                D,
                I,
                UP_GROUP,
                DENSE,
                UP_ZERO,
                UP_N,
                PDL,
            )
    enter(PDL)
    ticket = take(count_ptr)
    if ticket < up_items:
        slot = (ticket // UP_BLOCKS + slots) % every  # the dense chunks' slots first, then the experts'
        if slot < slots:  # an expert's [gate; up] rows, 2I of them
            expert = tl.load(slot_expert_ptr + slot).to(tl.int64)
            gate_up_rows(
                x_ptr,
                gate_up_packed_ptr + expert * (2 * I * (D // 8)),
                gate_up_scale_ptr + expert * (2 * I * (D // UP_GROUP)),
                gate_up_zero_ptr + expert * (2 * I * (D // UP_GROUP)),
                pair_ptr,
                h_ptr,
                tl.load(slot_begin_ptr + slot),
                tl.load(slot_end_ptr + slot),
                ticket % UP_BLOCKS,
                D,
                I,
                UP_GROUP,
                TOP_K,
                I,
                False,
                UP_ZERO,
                False,
                False,
                BLOCK_M,
                UP_N,
                UP_K,
            )
        elif DENSE:  # dense chunk j: gate rows j * I.., up rows DENSE * I below them
            chunk = slot - slots
            gate_up_rows(
                dense_x_ptr,
                dense_gate_up_packed_ptr + chunk * (I * (D // 8)),
                dense_gate_up_scale_ptr + chunk * (I * (D // UP_GROUP)),
                dense_gate_up_zero_ptr + chunk * (I * (D // UP_GROUP)),
                pair_ptr,
                h_ptr,
                T * TOP_K + chunk * T,
                T * TOP_K + chunk * T + T,
                ticket % UP_BLOCKS,
                D,
                I,
                UP_GROUP,
                TOP_K,
                DENSE * I,
                True,
                UP_ZERO,
                False,
                False,
                BLOCK_M,
                UP_N,
                UP_K,
            )
        count_in(count_ptr + FIRST_SLOT_COUNTER + slot)
    else:
        item = ticket - up_items
        slot = (item // DOWN_BLOCKS + slots) % every
        wait_count(count_ptr + FIRST_SLOT_COUNTER + slot, UP_BLOCKS)
        if slot < slots:
            expert = tl.load(slot_expert_ptr + slot).to(tl.int64)
            down_rows(
                h_ptr,
                down_packed_ptr + expert * (D * (I // 8)),
                down_scale_ptr + expert * (D * (I // DOWN_GROUP)),
                down_zero_ptr + expert * (D * (I // DOWN_GROUP)),
                pair_ptr,
                weight_ptr,
                y_ptr,
                tl.load(slot_begin_ptr + slot),
                tl.load(slot_end_ptr + slot),
                item % DOWN_BLOCKS,
                D,
                I,
                DOWN_GROUP,
                I,
                False,
                DOWN_ZERO,
                False,
                False,
                BLOCK_M,
                DOWN_N,
                DOWN_K,
                ".cg",
            )
        elif DENSE:
            chunk = slot - slots
            down_rows(
                h_ptr,
                dense_down_packed_ptr + chunk * (I // 8),
                dense_down_scale_ptr + chunk * (I // DOWN_GROUP),
                dense_down_zero_ptr + chunk * (I // DOWN_GROUP),
                pair_ptr,
                weight_ptr,
                y_ptr,
                T * TOP_K + chunk * T,
                T * TOP_K + chunk * T + T,
                item % DOWN_BLOCKS,
                D,
                I,
                DOWN_GROUP,
                DENSE * I,
                True,
                DOWN_ZERO,
                False,
                False,
                BLOCK_M,
                DOWN_N,
                DOWN_K,
                ".cg",
            )
        if count_in(count_ptr + 1) == every * DOWN_BLOCKS - 1:  # the last item: every ticket is taken
            at = tl.arange(0, RESET_BLOCK)
            tl.store(count_ptr + at, tl.zeros([RESET_BLOCK], tl.int32), mask=at < FIRST_SLOT_COUNTER + every)


def small_experts(
    x: torch.Tensor,
    gate_up: Int4Weight,
    down: Int4Weight,
    weight: torch.Tensor,
    top_k: int,
    grouping: tuple,
    dense: DenseMlp | None = None,
    chunks: int = 0,
) -> torch.Tensor:
    """The weighted pair outputs y [T * K (+ chunks * T), D] fp32 of 1..16 tokens x [T, D] on pairs
    grouped by expert (order, begin, end, expert) with routing weights [T * K]: one launch. With
    `chunks` (moe_triton.dense_chunks) the dense MLP's chunk partials follow the pairs' rows."""
    n_tokens = x.shape[0]
    _, two_i, d = gate_up.shape
    inter = two_i // 2
    pairs, begin, end, expert = grouping
    every = begin.numel() + chunks
    if FIRST_SLOT_COUNTER.value + every > ARRIVAL_COUNTERS:
        raise ValueError(f"{every} expert slots need more than the {ARRIVAL_COUNTERS} counters a launch may use")
    d_x, d_gate_up, d_down = x, gate_up, down  # with no chunks they stand in, never read
    if chunks:  # dense_chunks checked its weights are int4
        assert dense is not None and isinstance(dense.gate_up, Int4Weight) and isinstance(dense.down, Int4Weight)
        d_x, d_gate_up, d_down = dense.x.contiguous(), dense.gate_up, dense.down
    bm, up_n, up_k, warps = tiles(SMALL_GATE_UP, inter, d, True)
    down_bm, down_n, down_k, down_warps = tiles(SMALL_DOWN, d, inter, True)
    assert (bm, warps) == (down_bm, down_warps)  # one launch: one row tile, one warp count
    rows = n_tokens * (top_k + chunks)
    h = torch.empty(rows, inter, device=x.device, dtype=x.dtype)
    y = torch.empty(rows, d, device=x.device, dtype=torch.float32)
    items = triton.cdiv(inter, up_n) + triton.cdiv(d, down_n)
    _experts_kernel[(every * items,)](
        x,
        gate_up.packed,
        gate_up.scale,
        zero_arg(gate_up),
        down.packed,
        down.scale,
        zero_arg(down),
        pairs,
        weight,
        begin,
        end,
        expert,
        h,
        y,
        d_x,
        d_gate_up.packed,
        d_gate_up.scale,
        zero_arg(d_gate_up),
        d_down.packed,
        d_down.scale,
        zero_arg(d_down),
        arrival_counters(x.device),
        n_tokens,
        D=d,
        I=inter,
        UP_GROUP=gate_up.group_size,
        DOWN_GROUP=down.group_size,
        TOP_K=top_k,
        UP_ZERO=gate_up.zero is not None,
        DOWN_ZERO=down.zero is not None,
        BLOCK_M=bm,
        UP_N=up_n,
        UP_K=up_k,
        DOWN_N=down_n,
        DOWN_K=down_k,
        DENSE=chunks,
        num_warps=warps,
        num_stages=NUM_STAGES,
        **pdl_options(x.device),
    )
    return y


def small_specs(d: int, inter: int, group: int, top_k: int, dense_chunks: int) -> list[CompileSpec]:
    """The launches of experts [2I, D] and [D, I] in int4 with bf16 activations: sym and asym, with
    and without `dense_chunks` chunks of a dense MLP (moe_triton.compile_specs: the real model's)."""
    specs = []
    bm, up_n, up_k, warps = tiles(SMALL_GATE_UP, inter, d, True)
    _, down_n, down_k, _ = tiles(SMALL_DOWN, d, inter, True)
    for has_zero in (False, True):
        zero = "*i8" if has_zero else "*i32"
        sig = {name: "*i32" for name in _experts_kernel.arg_names if name.endswith("_ptr")}
        sig |= {name: "*bf16" for name in ("x_ptr", "h_ptr", "dense_x_ptr")}
        sig |= {name: "*bf16" for name in _experts_kernel.arg_names if name.endswith("scale_ptr")}
        sig |= {name: zero for name in _experts_kernel.arg_names if name.endswith("zero_ptr")}
        sig |= {"weight_ptr": "*fp32", "y_ptr": "*fp32", "T": "i32"}
        sig = {name: sig.get(name, "constexpr") for name in _experts_kernel.arg_names if name != "PDL"}
        for chunks in (0, dense_chunks):
            consts: dict[str, object] = dict(D=d, I=inter, UP_GROUP=group, DOWN_GROUP=group, TOP_K=top_k)
            consts |= dict(UP_ZERO=has_zero, DOWN_ZERO=has_zero, BLOCK_M=bm, UP_N=up_n, UP_K=up_k)
            consts |= dict(DOWN_N=down_n, DOWN_K=down_k, DENSE=chunks)
            name = f"moe_experts_small{f'_dense{chunks}' if chunks else ''}_{'asym' if has_zero else 'sym'}"
            specs.append(CompileSpec(name, _experts_kernel, sig, consts, num_warps=warps, num_stages=NUM_STAGES))
    return specs


# kernel -> the weights it asks L2 for whole before its wait, for engine/bench/step_launches.py: the
# dense MLP's chunks need no routing to be known
PREFETCHED = {"_experts_kernel": ("dense_gate_up_packed_ptr", "dense_gate_up_scale_ptr", "dense_gate_up_zero_ptr")}
PREFETCHED_BY_SOME = {"_experts_kernel"}  # the experts' items ask for nothing: their weights need the routing


def prefetching_programs(launch: dict) -> int:
    """How many of a launch's programs ask L2 for weights before their wait: the first, one per
    dense gate/up item (for the performance model: they are resident when the launch starts)."""
    c = launch["constexprs"]
    return c["DENSE"] * triton.cdiv(c["I"], c["UP_N"])


PREFETCHING_PROGRAMS = {"_experts_kernel": prefetching_programs}
