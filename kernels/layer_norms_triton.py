"""Triton kernels of `layer_norms`: a program runs a whole chain of norms on its rows, holding them
in registers, rounding to the activations' dtype wherever the torch ops round. The rows a program
takes depend on the row width only (one at Gemma 4's 2816; many for tiny test models, which keeps
the interpreter quick), so each row is reduced the same way whatever the number of rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec, pdl_options
from flashdesk.kernels.grid_dependency import enter, prefetch_tile, prefetch_vector
from flashdesk.kernels.norm_triton import row_shape, row_tile

if TYPE_CHECKING:  # the front's types; at run time the front calls this module, not the reverse
    from flashdesk.kernels.layer_norms import MlpOutWeights, RouterInput


@triton.jit
def _weight(w_ptr, cols, D):
    """A per-column vector [1, BLOCK] in fp32 (zero past D)."""
    return tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _norm(x, w_ptr, cols, D, eps, HAS_WEIGHT: tl.constexpr):
    """norm(x) [* w] in fp32 of fp32 rows [ROWS, BLOCK] (zero past D), as norm_triton computes it."""
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps))[:, None]
    if HAS_WEIGHT:
        y = y * _weight(w_ptr, cols, D)
    return y


@triton.jit
def _round(y, ty: tl.constexpr):
    """y rounded to the activations' dtype, kept in fp32 for the next step."""
    return y.to(ty).to(tl.float32)


@triton.jit
def attention_out_chain(
    rows,
    a_ptr,
    res_ptr,
    w_post_ptr,
    w_pre_ptr,
    w_experts_ptr,
    router_scale_ptr,
    router_scalar,
    h_ptr,
    x_ptr,
    experts_x_ptr,
    router_x_ptr,
    R,
    D,
    eps,
    MOE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The norms after attention of rows `rows` ([ROWS] indices, those >= R skipped), as
    `_attention_out_kernel` describes them. `a` is read past L1 (.cg): a fused kernel's other
    programs may have just written it."""
    cols = tl.arange(0, BLOCK)
    at, ok = rows[:, None] * D + cols[None, :], (rows < R)[:, None] & (cols < D)[None, :]
    ty: tl.constexpr = h_ptr.dtype.element_ty
    a = tl.load(a_ptr + at, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    h = _round(
        _round(_norm(a, w_post_ptr, cols, D, eps, True), ty) + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32),
        ty,
    )
    tl.store(h_ptr + at, h.to(ty), mask=ok)
    n = _norm(h, w_post_ptr, cols, D, eps, False)
    tl.store(x_ptr + at, (n * _weight(w_pre_ptr, cols, D)).to(ty), mask=ok)
    if MOE:
        tl.store(experts_x_ptr + at, (n * _weight(w_experts_ptr, cols, D)).to(ty), mask=ok)
        r = _round(n, ty) * _weight(router_scale_ptr, cols, D)
        tl.store(router_x_ptr + at, (_round(r, ty) * router_scalar).to(ty), mask=ok)


@triton.jit
def prefetch_attention_out(
    rows,
    res_ptr,
    w_post_ptr,
    w_pre_ptr,
    w_experts_ptr,
    router_scale_ptr,
    R,
    D,
    MOE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Before the wait: the residual rows (an earlier layer's output) and the norm weights; `a` is
    the projection's output, in L2."""
    prefetch_tile(res_ptr, rows, R, D, BLOCK, PDL)
    prefetch_vector(w_post_ptr, D, BLOCK, PDL)
    prefetch_vector(w_pre_ptr, D, BLOCK, PDL)
    if MOE:
        prefetch_vector(w_experts_ptr, D, BLOCK, PDL)
        prefetch_vector(router_scale_ptr, D, BLOCK, PDL)


@triton.jit(do_not_specialize=["R"])
def _attention_out_kernel(
    a_ptr,
    res_ptr,
    w_post_ptr,
    w_pre_ptr,
    w_experts_ptr,
    router_scale_ptr,
    router_scalar,
    h_ptr,
    x_ptr,
    experts_x_ptr,
    router_x_ptr,
    R,
    D,
    eps,
    MOE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """h = round(round(norm(a) * w_post) + res); x = norm(h) * w_pre; with MOE also the experts'
    input norm(h) * w_experts and the router's round(round(norm(h)) * router_scale) * scalar."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    prefetch_attention_out(rows, res_ptr, w_post_ptr, w_pre_ptr, w_experts_ptr, router_scale_ptr, R, D, MOE, BLOCK, PDL)
    enter(PDL)
    attention_out_chain(
        rows,
        a_ptr,
        res_ptr,
        w_post_ptr,
        w_pre_ptr,
        w_experts_ptr,
        router_scale_ptr,
        router_scalar,
        h_ptr,
        x_ptr,
        experts_x_ptr,
        router_x_ptr,
        R,
        D,
        eps,
        MOE,
        BLOCK,
    )


@triton.jit(do_not_specialize=["R"])
def _mlp_out_kernel(
    dense_ptr,
    experts_ptr,
    res_ptr,
    w_dense_ptr,
    w_experts_ptr,
    w_out_ptr,
    scalar_ptr,
    w_next_ptr,
    h_ptr,
    x_ptr,
    R,
    D,
    eps,
    MOE: tl.constexpr,
    TOP_K: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    DENSE_PARTS: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """TOP_K 0: the experts' output is rows [R, D]; else each row's TOP_K weighted expert outputs
    [R, TOP_K, D] fp32, summed in order and rounded (as moe's sum kernel would). DENSE_PARTS 0:
    the dense MLP's output is rows [R, D]; else its fp32 partials [DENSE_PARTS, R, D] (the chunks
    the expert kernels ran it as), summed in chunk order and rounded."""
    rows, cols, at, ok = row_tile(R, D, ROWS, BLOCK)
    prefetch_tile(res_ptr, rows, R, D, BLOCK, PDL)  # attention's; the MLPs' outputs are in L2
    prefetch_vector(w_out_ptr, D, BLOCK, PDL)
    prefetch_vector(w_next_ptr, D, BLOCK, PDL)
    if MOE:
        prefetch_vector(w_dense_ptr, D, BLOCK, PDL)
        prefetch_vector(w_experts_ptr, D, BLOCK, PDL)
    enter(PDL)
    ty: tl.constexpr = h_ptr.dtype.element_ty
    m = tl.load(dense_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if DENSE_PARTS:
        for p in tl.static_range(1, DENSE_PARTS):  # chunk order: the same bits for any row count
            m += tl.load(dense_ptr + p * R * D + at, mask=ok, other=0.0)
        m = _round(m, ty)
    if MOE:
        if TOP_K:
            pairs = experts_ptr + rows[:, None] * (TOP_K * D) + cols[None, :]
            e = tl.load(pairs, mask=ok, other=0.0)
            for k in tl.static_range(1, TOP_K):
                e += tl.load(pairs + k * D, mask=ok, other=0.0)
            e = _round(e, ty)
        else:
            e = tl.load(experts_ptr + at, mask=ok, other=0.0).to(tl.float32)
        m = _round(
            _round(_norm(e, w_experts_ptr, cols, D, eps, True), ty)
            + _round(_norm(m, w_dense_ptr, cols, D, eps, True), ty),
            ty,
        )
    h = _round(
        _round(_norm(m, w_out_ptr, cols, D, eps, True), ty) + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32),
        ty,
    )
    h = _round(h * tl.load(scalar_ptr).to(tl.float32), ty)
    tl.store(h_ptr + at, h.to(ty), mask=ok)
    tl.store(x_ptr + at, _norm(h, w_next_ptr, cols, D, eps, True).to(ty), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"layer norms take rows [T, D], got {tuple(x.shape)}")
    return x.contiguous()


def attention_out_triton(
    a: torch.Tensor,
    residual: torch.Tensor,
    eps: float,
    post_attention: torch.Tensor,
    pre_feedforward: torch.Tensor,
    moe: RouterInput | None,
) -> tuple:
    a, residual = _rows(a), _rows(residual)
    t, d = a.shape
    h, x = torch.empty_like(a), torch.empty_like(a)
    experts_x, router_x = (torch.empty_like(a), torch.empty_like(a)) if moe else (x, x)  # unused stand-ins
    if t:
        rows, block, warps = row_shape(d)
        _attention_out_kernel[(triton.cdiv(t, rows),)](
            a,
            residual,
            post_attention,
            pre_feedforward,
            moe.experts_weight if moe else pre_feedforward,
            moe.router_scale if moe else a,
            moe.router_scalar if moe else 1.0,
            h,
            x,
            experts_x,
            router_x,
            t,
            d,
            eps,
            MOE=moe is not None,
            ROWS=rows,
            BLOCK=block,
            num_warps=warps,
            num_stages=LAUNCH_STAGES,
            **pdl_options(a.device),
        )
    return (h, x, experts_x, router_x) if moe else (h, x)


def mlp_out_triton(
    dense: torch.Tensor, experts: torch.Tensor | None, residual: torch.Tensor, eps: float, w: MlpOutWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    residual = _rows(residual)
    t, d = residual.shape
    parts = 0
    if dense.dim() == 3:  # the dense MLP's per-chunk partials, from the expert kernels
        parts = dense.shape[0]
        if dense.dtype != torch.float32 or dense.shape[1:] != (t, d):
            raise ValueError(f"dense partials must be fp32 [S, {t}, {d}], got {dense.dtype} {tuple(dense.shape)}")
        dense = dense.contiguous()
    else:
        dense = _rows(dense)
    h, x = torch.empty_like(residual), torch.empty_like(residual)
    moe = experts is not None
    top_k = 0
    if experts is not None:
        top_k = experts.shape[1] if experts.dim() == 3 else 0
        if top_k:
            if experts.dtype != torch.float32 or experts.shape != (t, top_k, d):
                raise ValueError(
                    f"per-expert outputs must be fp32 [{t}, K, {d}], got {experts.dtype} {tuple(experts.shape)}"
                )
            experts = experts.contiguous()
        else:
            experts = _rows(experts)
    if t:
        rows, block, warps = row_shape(d)
        _mlp_out_kernel[(triton.cdiv(t, rows),)](
            dense,
            experts if moe else dense,
            residual,
            w.dense if moe else w.output,
            w.experts if moe else w.output,
            w.output,
            w.layer_scalar,
            w.next_norm,
            h,
            x,
            t,
            d,
            eps,
            MOE=moe,
            TOP_K=top_k,
            ROWS=rows,
            BLOCK=block,
            DENSE_PARTS=parts,
            num_warps=warps,
            num_stages=LAUNCH_STAGES,
            **pdl_options(dense.device),
        )
    return h, x


def compile_specs() -> list[CompileSpec]:
    """The real model's rows: hidden 2816 in bf16, fp32 norm weights, bf16 router scale and layer
    scalar; every layer has its MoE."""
    per_program, block, warps = row_shape(2816)
    rows = {"R": "i32", "D": "i32", "eps": "fp32", "MOE": "constexpr", "ROWS": "constexpr", "BLOCK": "constexpr"}
    flags: dict[str, object] = {"MOE": True, "ROWS": per_program, "BLOCK": block}
    attention_out = {
        "a_ptr": "*bf16",
        "res_ptr": "*bf16",
        "w_post_ptr": "*fp32",
        "w_pre_ptr": "*fp32",
        "w_experts_ptr": "*fp32",
        "router_scale_ptr": "*bf16",
        "router_scalar": "fp32",
        "h_ptr": "*bf16",
        "x_ptr": "*bf16",
        "experts_x_ptr": "*bf16",
        "router_x_ptr": "*bf16",
    } | rows
    mlp_out = {
        "dense_ptr": "*bf16",
        "experts_ptr": "*fp32",
        "res_ptr": "*bf16",
        "w_dense_ptr": "*fp32",
        "w_experts_ptr": "*fp32",
        "w_out_ptr": "*fp32",
        "scalar_ptr": "*bf16",
        "w_next_ptr": "*fp32",
        "h_ptr": "*bf16",
        "x_ptr": "*bf16",
    } | rows
    mlp_out = {name: mlp_out.get(name, "constexpr") for name in _mlp_out_kernel.arg_names}
    # the dense MLP's output as rows (prefill) or as the expert kernels' 3 chunk partials (decode, verify)
    partials = mlp_out | {"dense_ptr": "*fp32"}
    return [
        CompileSpec("attention_out_norms[D=2816]", _attention_out_kernel, attention_out, flags, warps),
        CompileSpec(
            "mlp_out_norms[D=2816, top 8]", _mlp_out_kernel, mlp_out, flags | {"TOP_K": 8, "DENSE_PARTS": 0}, warps
        ),
        CompileSpec(
            "mlp_out_norms[D=2816, top 8, dense in 3 parts]",
            _mlp_out_kernel,
            partials,
            flags | {"TOP_K": 8, "DENSE_PARTS": 3},
            warps,
        ),
    ]
