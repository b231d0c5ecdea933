"""RMSNorm as Gemma 4 defines it: in fp32, times the weight as is (no 1 + w), one cast back.

A norm reduces each row on its own, but torch's reduction kernels choose how to split a row from
the whole tensor's size, so a row's bits could change with the number of rows. The Triton kernel
reduces each row in one program with a fixed block, which keeps verify rows equal to decode rows.
"""

from __future__ import annotations

import torch

from flashdesk.kernels.backend import use_triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight
    return y.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., D] normalized over its last dimension; weight [D] fp32 or None."""
    if use_triton(x):
        from flashdesk.kernels.norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps)
