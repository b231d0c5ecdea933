"""Mixture-of-experts feed-forward: each token through its top-k experts, weighted and summed.

Expert e computes down_e(gelu_tanh(gate_e x) * up_e x), with gate and up stacked in one
[E, 2I, D] tensor (gate rows first). The reference loops over the experts that were hit, which is
exact and cheap enough for the CPU; a fused Triton kernel will replace it on the GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_idx: torch.Tensor,
                  top_w: torch.Tensor) -> torch.Tensor:
    """x [T, D], gate_up [E, 2I, D], down [E, D, I], top_idx/top_w [T, K] -> [T, D]."""
    out = torch.zeros_like(x)
    flat_idx = top_idx.reshape(-1)
    order = torch.argsort(flat_idx, stable=True)
    counts = torch.bincount(flat_idx, minlength=gate_up.shape[0]).tolist()
    token_of = order // top_idx.shape[1]
    weight_of = top_w.reshape(-1)[order]
    begin = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[begin:begin + count]
        gate, up = F.linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.gelu(gate, approximate="tanh") * up, down[expert])
        out.index_add_(0, rows, (y * weight_of[begin:begin + count, None]).to(out.dtype))
        begin += count
    return out


def moe(x, gate_up, down, top_idx, top_w):
    """Dispatcher: the reference everywhere for now."""
    return moe_reference(x, gate_up, down, top_idx, top_w)
