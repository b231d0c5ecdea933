"""RMSNorm as Gemma 4 defines it: in fp32, times the weight as is (no 1 + w), one cast back.

A norm reduces each row on its own, but torch's reduction kernels choose how to split a row from
the whole tensor's size, so a row's bits could change with the number of rows. The Triton kernel
reduces each row in one program with a fixed block, which keeps verify rows equal to decode rows.
"""

from __future__ import annotations

import torch

from flashdesk.kernels.backend import use_triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
                       scale: torch.Tensor | None = None) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight
    y = y.to(x.dtype)
    if residual is not None:
        y = residual + y
    return y * scale if scale is not None else y


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
             scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D] normalized over its last dimension; weight [D] fp32 or None. With `residual`
    (like x) the result is residual + norm, then times `scale` (a one-element tensor) if given:
    one kernel instead of three on the Triton path."""
    if use_triton(x):
        from flashdesk.kernels.norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual, scale)
    return rms_norm_reference(x, weight, eps, residual, scale)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half RoPE; x [T, H, D], cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """apply_rope(rms_norm(x, weight), cos, sin) for q or k heads x [T, H, D]: one kernel on the
    Triton path (read in place from the fused qkv output) instead of a copy, a norm and five
    elementwise ops; heads of another size or layout take those ops."""
    if use_triton(x):
        from flashdesk.kernels.norm_triton import rms_norm_rope_triton, rope_fusable

        if rope_fusable(x):
            return rms_norm_rope_triton(x, weight, cos, sin, eps)
    return apply_rope(rms_norm(x, weight, eps), cos, sin)
