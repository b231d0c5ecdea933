"""Mixture-of-experts feed-forward: each token through its top-k experts, weighted and summed.

Expert e computes down_e(gelu_tanh(gate_e x) * up_e x), with gate and up stacked in one
[E, 2I, D] tensor (gate rows first). The reference loops over the experts that were hit, reading
each expert's weights once (one host sync per call, for the counts); when the (token, expert)
pairs' weights are small (tiny models, the CPU) one batched matmul over gathered weights does the
same with far fewer ops and no sync. On the Triton path int4 experts go through the fused kernel (`moe_triton`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashdesk.kernels.backend import use_triton
from flashdesk.kernels.int4 import Int4Weight, as_dense
from flashdesk.kernels.linear import linear


def moe_reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_idx: torch.Tensor,
                  top_w: torch.Tensor) -> torch.Tensor:
    """x [T, D], gate_up [E, 2I, D], down [E, D, I], top_idx/top_w [T, K] -> [T, D]."""
    out = torch.zeros_like(x)
    flat_idx = top_idx.reshape(-1)
    order = torch.argsort(flat_idx, stable=True)
    counts = torch.bincount(flat_idx, minlength=gate_up.shape[0]).tolist()  # one host sync per call
    token_of = order // top_idx.shape[1]
    weight_of = top_w.reshape(-1)[order]
    begin = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[begin:begin + count]
        gate, up = linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        y = linear(F.gelu(gate, approximate="tanh") * up, down[expert])
        out.index_add_(0, rows, (y * weight_of[begin:begin + count, None]).to(out.dtype))
        begin += count
    return out


GATHER_LIMIT_BYTES = 16 << 20  # gathered expert weights per call below which batching wins


def moe_gathered(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_idx: torch.Tensor,
                 top_w: torch.Tensor) -> torch.Tensor:
    """Same function as moe_reference: each (token, expert) pair as one row of a batched matmul."""
    t, k = top_idx.shape
    flat = top_idx.reshape(-1)
    rows = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [T*K, D, 1]
    gate, up = torch.bmm(as_dense(gate_up[flat], x.dtype), rows).squeeze(-1).chunk(2, dim=-1)
    y = torch.bmm(as_dense(down[flat], x.dtype), (F.gelu(gate, approximate="tanh") * up).unsqueeze(-1)).squeeze(-1)
    return (y.view(t, k, -1) * top_w.unsqueeze(-1)).sum(dim=1).to(x.dtype)


def moe(x, gate_up, down, top_idx, top_w):
    """Dispatcher: the fused Triton kernel for int4 experts on the Triton path; in torch, gathered
    for small weight volumes, the per-expert loop otherwise (prefill of big models)."""
    if use_triton(x) and isinstance(gate_up, Int4Weight) and isinstance(down, Int4Weight):
        from flashdesk.kernels.moe_triton import fused_moe

        return fused_moe(x, gate_up, down, top_idx, top_w)
    per_pair = (gate_up.shape[1] * gate_up.shape[2] + down.shape[1] * down.shape[2]) * x.element_size()
    if top_idx.numel() * per_pair <= GATHER_LIMIT_BYTES:
        return moe_gathered(x, gate_up, down, top_idx, top_w)
    return moe_reference(x, gate_up, down, top_idx, top_w)
