"""The router's softmax, top-k, renormalization and expert scales, ROUTE_ROWS tokens a program
(the fused MoE's decode and verify blocks route all their tokens in its grouping kernel instead,
in tiles of the same shape).

The top k are taken by k rounds of max / argmax (the lowest index wins a tie), largest first as
torch.topk returns them, and summed in that order as `ordered_sum` does, so the weights round as
the torch ops round but for the softmax's own sum."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec, pdl_options
from flashdesk.kernels.grid_dependency import enter

ROUTER_WARPS = 1  # 128 experts: four a thread per row
ROUTE_ROWS = 4  # rows a program: the interpreter pays per op and program; 16 x 128 tiles compiled slowly


@triton.jit
def route_rows(
    logits_ptr,
    scale_ptr,
    w_ptr,
    idx_ptr,
    rows,
    R,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Route the logits rows `rows` (a vector; those >= R are skipped): weights [R, TOP_K] fp32 and
    expert ids [R, TOP_K] in idx's dtype. Each row is reduced along its own axis: rows never mix."""
    e = tl.arange(0, BLOCK_E)
    ok = (rows < R)[:, None]
    x = tl.load(logits_ptr + rows[:, None] * E + e[None, :], mask=ok & (e < E)[None, :], other=0.0).to(tl.float32)
    x = tl.where((e < E)[None, :], x, float("-inf"))
    p = tl.exp(x - tl.max(x, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]
    p = tl.where((e < E)[None, :], p, -1.0)  # padding is never chosen
    k = tl.arange(0, BLOCK_K)[None, :]
    top_w = tl.zeros([rows.shape[0], BLOCK_K], tl.float32)
    top_i = tl.zeros([rows.shape[0], BLOCK_K], tl.int32)
    total = tl.zeros([rows.shape[0]], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, 1)
        at = tl.argmax(p, 1)
        top_w = tl.where(k == j, best[:, None], top_w)
        top_i = tl.where(k == j, at[:, None], top_i)
        total = total + best
        p = tl.where(e[None, :] == at[:, None], -1.0, p)
    chosen = ok & (k < TOP_K)
    scale = tl.load(scale_ptr + top_i, mask=chosen, other=0.0).to(tl.float32)
    out = rows[:, None] * TOP_K + k
    tl.store(w_ptr + out, top_w / total[:, None] * scale, mask=chosen)
    tl.store(idx_ptr + out, top_i.to(idx_ptr.dtype.element_ty), mask=chosen)


@triton.jit(do_not_specialize=["R"])
def _route_kernel(
    logits_ptr,
    scale_ptr,
    w_ptr,
    idx_ptr,
    R,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """ROWS rows a program (prefill's many rows in parallel); each row is reduced on its own, so
    its bits do not depend on which rows share its tile."""
    enter(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    route_rows(logits_ptr, scale_ptr, w_ptr, idx_ptr, rows, R, E, TOP_K, BLOCK_E, BLOCK_K)


def route_triton(logits: torch.Tensor, top_k: int, per_expert_scale: torch.Tensor):
    t, e = logits.shape
    if not 0 < top_k <= e:
        raise ValueError(f"top_k {top_k} must be between 1 and the {e} experts")
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    if t:
        _route_kernel[(triton.cdiv(t, ROUTE_ROWS),)](
            logits.contiguous(),
            per_expert_scale,
            weights,
            ids,
            t,
            E=e,
            TOP_K=top_k,
            ROWS=ROUTE_ROWS,
            BLOCK_E=triton.next_power_of_2(e),
            BLOCK_K=triton.next_power_of_2(top_k),
            num_warps=ROUTER_WARPS,
            num_stages=LAUNCH_STAGES,
            **pdl_options(logits.device),
        )
    return weights, ids


def compile_specs() -> list[CompileSpec]:
    """Gemma 4 26B-A4B: 128 experts, top 8, bf16 logits and scales."""
    return [
        CompileSpec(
            "route[E=128,top 8]",
            _route_kernel,
            {
                "logits_ptr": "*bf16",
                "scale_ptr": "*bf16",
                "w_ptr": "*fp32",
                "idx_ptr": "*i64",
                "R": "i32",
                **dict.fromkeys(("E", "TOP_K", "ROWS", "BLOCK_E", "BLOCK_K"), "constexpr"),
            },
            {"E": 128, "TOP_K": 8, "ROWS": ROUTE_ROWS, "BLOCK_E": 128, "BLOCK_K": 8},
            num_warps=ROUTER_WARPS,
        )
    ]
