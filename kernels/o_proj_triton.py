"""Triton kernel of `layer_norms.o_proj_and_norms`: a decode step's attention output projection
(int4) with the norms after attention in the same launch.

The projection runs as `linear_triton`'s kernel runs it (the same tiles, split-K and sums: its
output bits are the linear's). Each output tile that is final counts itself in on one counter;
the tile that completes the row runs the chain of norms after attention on it
(`layer_norms_triton.attention_out_chain`, the code of the norms' own kernel, in the same
[1, 4096] layout with the same 8 warps: the same bits). That saves the chain's launch, a
one-program kernel whose gap and DRAM latency cost more than its work at batch 1. Only a decode
step's single row runs fused: a verify block's 16 rows would run one after another in one program,
so blocks take the projection and the norms' kernel (one program a row) apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import ARRIVAL_COUNTERS, CompileSpec, arrival_counters, interpreted, pdl_options
from flashdesk.kernels.layer_norms_triton import attention_out_chain, prefetch_attention_out
from flashdesk.kernels.linear_triton import HIDDEN, finish_tile, small_tiles, tile_product
from flashdesk.kernels.norm_triton import row_shape

if TYPE_CHECKING:  # the front's types; at run time the front calls this module, not the reverse
    from flashdesk.kernels.int4 import Int4Weight
    from flashdesk.kernels.layer_norms import RouterInput


@triton.jit(do_not_specialize=["M"])
def _o_proj_norms_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    a_ptr,
    part_ptr,
    count_ptr,
    row_count_ptr,
    res_ptr,
    w_post_ptr,
    w_pre_ptr,
    w_experts_ptr,
    router_scale_ptr,
    router_scalar,
    h_ptr,
    xn_ptr,
    experts_x_ptr,
    router_x_ptr,
    M,
    N,
    eps,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MOE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """a = x @ w.T (int4; grid and split as `_linear_kernel`'s), then for its M <= ROWS rows
    `_attention_out_kernel`'s chain: h, xn (the MLP's input) and, with MOE, the experts' and the
    router's inputs. count_ptr: the split tiles' counters; row_count_ptr: one per row tile; both
    zero between launches."""
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if (pid_n == 0) & (pid_s == 0):  # one program asks L2 for what the chain reads from DRAM
        prefetch_attention_out(
            pid_m * BLOCK_M + tl.arange(0, ROWS),
            res_ptr,
            w_post_ptr,
            w_pre_ptr,
            w_experts_ptr,
            router_scale_ptr,
            M,
            N,
            MOE,
            BLOCK,
            PDL,
        )
    acc = tile_product(
        x_ptr,
        w_ptr,
        scale_ptr,
        zero_ptr,
        pid_n,
        pid_s,
        offs_m,
        N,
        K,
        K_CHUNK,
        GROUP,
        True,
        HAS_ZERO,
        DOT_FP32,
        "",
        BLOCK_N,
        BLOCK_K,
        PDL,
        False,
        M,
    )
    if finish_tile(acc, a_ptr, part_ptr, count_ptr, pid_n, pid_s, pid_m, offs_m, M, N, SPLIT, BLOCK_M):
        tl.debug_barrier()  # every thread's outputs are stored before the tile counts in
        counter = row_count_ptr + pid_m
        if tl.atomic_add(counter, 1, sem="acq_rel") == tl.num_programs(0) - 1:  # the row's tiles are visible
            attention_out_chain(  # the rows one of the norms' programs takes; no loop (it would be pipelined)
                pid_m * BLOCK_M + tl.arange(0, ROWS).to(tl.int64),
                a_ptr,
                res_ptr,
                w_post_ptr,
                w_pre_ptr,
                w_experts_ptr,
                router_scale_ptr,
                router_scalar,
                h_ptr,
                xn_ptr,
                experts_x_ptr,
                router_x_ptr,
                M,
                N,
                eps,
                MOE,
                BLOCK,
            )
            tl.atomic_xchg(counter, 0, sem="relaxed")  # the next launch starts from zero


def fusable(rows: int, n: int, k: int, group_size: int) -> bool:
    """Whether a projection runs fused: one row, its tiles within the counters, and on a GPU the
    norms' own kernel's warps (so the chain runs in the same layout and rounds the same; the
    interpreter has no layouts, and takes the tiny test models' rows here too)."""
    tiles = small_tiles(n, k, group_size)
    same_layout = interpreted() or row_shape(n)[2] == tiles.num_warps
    return rows == 1 and same_layout and triton.cdiv(n, tiles.block_n) <= ARRIVAL_COUNTERS


def o_proj_norms_triton(
    a: torch.Tensor,
    w: Int4Weight,
    residual: torch.Tensor,
    eps: float,
    post_attention: torch.Tensor,
    pre_feedforward: torch.Tensor,
    moe: RouterInput | None,
) -> tuple:
    """attention_out_norms(linear(a, w), residual, ...) of one row in one launch: (h, x) or
    (h, x, experts_x, router_x)."""
    m, k = a.shape
    n = w.shape[0]
    if w.shape[1] != k or residual.shape != (m, n):
        raise ValueError(
            f"o_proj {tuple(w.shape)} does not match a {tuple(a.shape)} and residual {tuple(residual.shape)}"
        )
    if not fusable(m, n, k, w.group_size) or m > row_shape(n)[0]:
        raise ValueError(f"an o_proj of {n} outputs over {m} rows does not run fused (one row)")
    tiles = small_tiles(n, k, w.group_size)
    residual = residual.contiguous()
    out = torch.empty(m, n, device=a.device, dtype=a.dtype)
    h, x = torch.empty_like(out), torch.empty_like(out)
    experts_x, router_x = (torch.empty_like(out), torch.empty_like(out)) if moe else (x, x)  # unused stand-ins
    part = out if tiles.split == 1 else torch.empty(tiles.split, m, n, device=a.device, dtype=torch.float32)
    counters = arrival_counters(a.device)
    packed = w.packed.contiguous()
    _o_proj_norms_kernel[(triton.cdiv(n, tiles.block_n), tiles.split, 1)](
        a.contiguous(),
        packed,
        w.scale.contiguous(),
        packed.view(torch.int8) if w.zero is None else w.zero.contiguous(),
        out,
        part,
        counters[:ARRIVAL_COUNTERS],
        counters[ARRIVAL_COUNTERS:],
        residual,
        post_attention,
        pre_feedforward,
        moe.experts_weight if moe else pre_feedforward,
        moe.router_scale if moe else out,
        moe.router_scalar if moe else 1.0,
        h,
        x,
        experts_x,
        router_x,
        m,
        n,
        eps,
        K=k,
        K_CHUNK=tiles.k_chunk,
        SPLIT=tiles.split,
        GROUP=w.group_size,
        HAS_ZERO=w.zero is not None,
        DOT_FP32=interpreted(),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        MOE=moe is not None,
        ROWS=row_shape(n)[0],
        BLOCK=row_shape(n)[1],
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **pdl_options(a.device),
    )
    return (h, x, experts_x, router_x) if moe else (h, x)


# the target's o_proj: a sliding layer's 16 heads of 256, a full layer's 16 of 512
TARGET_INPUTS = (4096, 8192)


def compile_specs() -> list[CompileSpec]:
    """Decode steps of the real model: both o_proj widths, symmetric group-32 int4 (the published
    export; other groups compile on first use), the MoE's four outputs."""
    specs = []
    for k in TARGET_INPUTS:
        tiles = small_tiles(HIDDEN, k, 32)
        signature = {
            "x_ptr": "*bf16",
            "w_ptr": "*i32",
            "scale_ptr": "*bf16",
            "zero_ptr": "*i8",
            "a_ptr": "*bf16",
            "part_ptr": "*fp32" if tiles.split > 1 else "*bf16",
            "count_ptr": "*i32",
            "row_count_ptr": "*i32",
            "res_ptr": "*bf16",
            "w_post_ptr": "*fp32",
            "w_pre_ptr": "*fp32",
            "w_experts_ptr": "*fp32",
            "router_scale_ptr": "*bf16",
            "router_scalar": "fp32",
            "h_ptr": "*bf16",
            "xn_ptr": "*bf16",
            "experts_x_ptr": "*bf16",
            "router_x_ptr": "*bf16",
            "M": "i32",
            "N": "i32",
            "eps": "fp32",
        }
        constexprs: dict[str, object] = {
            "K": k,
            "K_CHUNK": tiles.k_chunk,
            "SPLIT": tiles.split,
            "GROUP": 32,
            "HAS_ZERO": False,
            "DOT_FP32": False,
            "BLOCK_M": tiles.block_m,
            "BLOCK_N": tiles.block_n,
            "BLOCK_K": tiles.block_k,
            "MOE": True,
            "ROWS": row_shape(HIDDEN)[0],
            "BLOCK": row_shape(HIDDEN)[1],
        }
        signature.update(dict.fromkeys(constexprs, "constexpr"))
        specs.append(
            CompileSpec(
                f"o_proj_norms[K={k},N={HIDDEN}]",
                _o_proj_norms_kernel,
                signature,
                constexprs,
                tiles.num_warps,
                tiles.num_stages,
            )
        )
    return specs


def tail(launch: dict) -> tuple[CompileSpec, int]:
    """What the last program runs after the others, for the performance model: the norms' own
    kernel (the same code) at the real width, once (one row)."""
    from flashdesk.kernels.layer_norms_triton import compile_specs as norm_specs

    if launch["constexprs"].get("BLOCK") != row_shape(HIDDEN)[1]:
        raise ValueError("the norms after attention are compiled at the real width only: no tail to charge")
    spec = next(s for s in norm_specs() if s.name == "attention_out_norms[D=2816]")
    if not launch["constexprs"].get("MOE", True):
        spec = CompileSpec(spec.name, spec.fn, spec.signature, spec.constexprs | {"MOE": False}, spec.num_warps)
    return spec, 1


TAILS = {"_o_proj_norms_kernel": tail}  # kernel -> its tail, for engine/bench/step_launches.py
