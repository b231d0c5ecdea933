"""Triton kernels of `layer_norms`: one program per row runs a whole chain of norms, holding the
row in registers, rounding to the activations' dtype wherever the torch ops round."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec
from flashdesk.kernels.layer_norms import MlpOutWeights, RouterInput


@triton.jit
def _norm(x, w_ptr, cols, ok, D, eps, HAS_WEIGHT: tl.constexpr):
    """norm(x) [* w] in fp32 of one fp32 row (zero past D), as norm_triton computes it."""
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps))
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    return y


@triton.jit
def _round(y, ty: tl.constexpr):
    """y rounded to the activations' dtype, kept in fp32 for the next step."""
    return y.to(ty).to(tl.float32)


@triton.jit
def _attention_out_kernel(a_ptr, res_ptr, w_post_ptr, w_pre_ptr, w_experts_ptr, router_scale_ptr, router_scalar,
                          h_ptr, x_ptr, experts_x_ptr, router_x_ptr, D, eps, MOE: tl.constexpr,
                          BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    at = tl.program_id(0).to(tl.int64) * D + cols
    ty: tl.constexpr = h_ptr.dtype.element_ty
    a = tl.load(a_ptr + at, mask=ok, other=0.0).to(tl.float32)
    h = _round(_round(_norm(a, w_post_ptr, cols, ok, D, eps, True), ty)
               + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32), ty)
    tl.store(h_ptr + at, h.to(ty), mask=ok)
    n = _norm(h, w_post_ptr, cols, ok, D, eps, False)
    tl.store(x_ptr + at, (n * tl.load(w_pre_ptr + cols, mask=ok, other=0.0).to(tl.float32)).to(ty), mask=ok)
    if MOE:
        w_experts = tl.load(w_experts_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(experts_x_ptr + at, (n * w_experts).to(ty), mask=ok)
        r = _round(n, ty) * tl.load(router_scale_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(router_x_ptr + at, (_round(r, ty) * router_scalar).to(ty), mask=ok)


@triton.jit
def _mlp_out_kernel(dense_ptr, experts_ptr, res_ptr, w_dense_ptr, w_experts_ptr, w_out_ptr, scalar_ptr,
                    w_next_ptr, h_ptr, x_ptr, D, eps, MOE: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    at = tl.program_id(0).to(tl.int64) * D + cols
    ty: tl.constexpr = h_ptr.dtype.element_ty
    m = tl.load(dense_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if MOE:
        e = tl.load(experts_ptr + at, mask=ok, other=0.0).to(tl.float32)
        m = _round(_round(_norm(e, w_experts_ptr, cols, ok, D, eps, True), ty)
                   + _round(_norm(m, w_dense_ptr, cols, ok, D, eps, True), ty), ty)
    h = _round(_round(_norm(m, w_out_ptr, cols, ok, D, eps, True), ty)
               + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32), ty)
    h = _round(h * tl.load(scalar_ptr).to(tl.float32), ty)
    tl.store(h_ptr + at, h.to(ty), mask=ok)
    tl.store(x_ptr + at, _norm(h, w_next_ptr, cols, ok, D, eps, True).to(ty), mask=ok)


def _shape(d: int) -> tuple[int, int]:
    """(block, warps) for rows of width d: the whole row in one block."""
    block = triton.next_power_of_2(d)
    return block, 8 if block >= 2048 else 4


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"layer norms take rows [T, D], got {tuple(x.shape)}")
    return x.contiguous()


def attention_out_triton(a: torch.Tensor, residual: torch.Tensor, eps: float, post_attention: torch.Tensor,
                         pre_feedforward: torch.Tensor, moe: RouterInput | None) -> tuple:
    a, residual = _rows(a), _rows(residual)
    t, d = a.shape
    h, x = torch.empty_like(a), torch.empty_like(a)
    experts_x, router_x = (torch.empty_like(a), torch.empty_like(a)) if moe else (x, x)  # unused stand-ins
    if t:
        block, warps = _shape(d)
        _attention_out_kernel[(t,)](
            a, residual, post_attention, pre_feedforward, moe.experts_weight if moe else pre_feedforward,
            moe.router_scale if moe else a, moe.router_scalar if moe else 1.0, h, x, experts_x, router_x, d, eps,
            MOE=moe is not None, BLOCK=block, num_warps=warps, num_stages=LAUNCH_STAGES)
    return (h, x, experts_x, router_x) if moe else (h, x)


def mlp_out_triton(dense: torch.Tensor, experts: torch.Tensor | None, residual: torch.Tensor, eps: float,
                   w: MlpOutWeights) -> tuple[torch.Tensor, torch.Tensor]:
    dense, residual = _rows(dense), _rows(residual)
    t, d = dense.shape
    h, x = torch.empty_like(dense), torch.empty_like(dense)
    if t:
        block, warps = _shape(d)
        moe = experts is not None
        _mlp_out_kernel[(t,)](
            dense, _rows(experts) if moe else dense, residual, w.dense if moe else w.output,
            w.experts if moe else w.output, w.output, w.layer_scalar, w.next_norm, h, x, d, eps,
            MOE=moe, BLOCK=block, num_warps=warps, num_stages=LAUNCH_STAGES)
    return h, x


def compile_specs() -> list[CompileSpec]:
    """The real model's rows: hidden 2816 in bf16, fp32 norm weights, bf16 router scale and layer
    scalar; every layer has its MoE."""
    block, warps = _shape(2816)
    rows = {"D": "i32", "eps": "fp32", "MOE": "constexpr", "BLOCK": "constexpr"}
    flags = {"MOE": True, "BLOCK": block}
    attention_out = {"a_ptr": "*bf16", "res_ptr": "*bf16", "w_post_ptr": "*fp32", "w_pre_ptr": "*fp32",
                     "w_experts_ptr": "*fp32", "router_scale_ptr": "*bf16", "router_scalar": "fp32",
                     "h_ptr": "*bf16", "x_ptr": "*bf16", "experts_x_ptr": "*bf16", "router_x_ptr": "*bf16"} | rows
    mlp_out = {"dense_ptr": "*bf16", "experts_ptr": "*bf16", "res_ptr": "*bf16", "w_dense_ptr": "*fp32",
               "w_experts_ptr": "*fp32", "w_out_ptr": "*fp32", "scalar_ptr": "*bf16", "w_next_ptr": "*fp32",
               "h_ptr": "*bf16", "x_ptr": "*bf16"} | rows
    return [CompileSpec("attention_out_norms[D=2816]", _attention_out_kernel, attention_out, flags, warps),
            CompileSpec("mlp_out_norms[D=2816]", _mlp_out_kernel, mlp_out, flags, warps)]
