"""Mixture-of-experts feed-forward: each token through its top-k experts, weighted and summed.

Expert e computes down_e(gelu_tanh(gate_e x) * up_e x), with gate and up stacked in one
[E, 2I, D] tensor (gate rows first). The reference loops over the experts that were hit, reading
each expert's weights once (one host sync per call, for the counts). When all the experts together
are small (tiny models on the CPU) every expert runs on every token in two matmuls and the chosen
outputs are picked: cheaper than gathering each pair's weights (a 9-token verify of the demo costs
1.4 plain steps instead of 1.9), no sync, and the same path for one token and sixteen (the CPU's
bf16 matmul gives a row the same bits whatever the row count; a GPU's need not, so it stays on the
CPU). Between the two, when the (token, expert) pairs' weights are small, one batched matmul over
gathered weights. On the Triton path int4 experts go through the fused kernel (`moe_triton`).
A Gemma 4 layer's dense MLP beside the experts (`dense_and_routed_moe`) rides along in the same
expert launch there when its weights fit it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from flashdesk.kernels.backend import faulty, use_triton
from flashdesk.kernels.int4 import Int4Weight, as_dense
from flashdesk.kernels.linear import glu_linear, linear
from flashdesk.kernels.router import ordered_sum, route


class DenseMlp(NamedTuple):
    """A layer's dense GLU MLP (gelu_tanh) beside its experts: its input rows [T, D] and weights,
    [gate; up] [2N, D] and down [D, N]."""

    x: torch.Tensor
    gate_up: Int4Weight | torch.Tensor
    down: Int4Weight | torch.Tensor


def moe_reference(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor
) -> torch.Tensor:
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
        rows = token_of[begin : begin + count]
        gate, up = linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        y = linear(F.gelu(gate, approximate="tanh") * up, down[expert])
        out.index_add_(0, rows, (y * weight_of[begin : begin + count, None]).to(out.dtype))
        begin += count
    return out


EVERY_EXPERT_LIMIT_BYTES = 4 << 20  # all experts' weights below which each token runs them all
GATHER_LIMIT_BYTES = 16 << 20  # gathered expert weights per call below which batching wins


def moe_gathered(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor
) -> torch.Tensor:
    """Same function as moe_reference: each (token, expert) pair as one row of a batched matmul."""
    t, k = top_idx.shape
    flat = top_idx.reshape(-1)
    rows = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [T*K, D, 1]
    gate, up = torch.bmm(as_dense(gate_up[flat], x.dtype), rows).squeeze(-1).chunk(2, dim=-1)
    y = torch.bmm(as_dense(down[flat], x.dtype), (F.gelu(gate, approximate="tanh") * up).unsqueeze(-1)).squeeze(-1)
    return (y.view(t, k, -1) * top_w.unsqueeze(-1)).sum(dim=1).to(x.dtype)


def moe_every_expert(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor
) -> torch.Tensor:
    """Same function as moe_reference: every expert on every token, then each token's top-k picked
    and summed in top-k order. Which path runs depends on the weights only, never on the token count."""
    t = top_idx.shape[0]
    e, two_i, d = gate_up.shape
    gate, up = F.linear(x, as_dense(gate_up, x.dtype).reshape(e * two_i, d)).view(t, e, two_i).chunk(2, dim=-1)
    act = (F.gelu(gate, approximate="tanh") * up).transpose(0, 1)  # [E, T, I]
    y = torch.bmm(act, as_dense(down, x.dtype).transpose(1, 2))  # [E, T, D]
    picked = y[top_idx, torch.arange(t, device=x.device).unsqueeze(-1)] * top_w.unsqueeze(-1)  # [T, K, D]
    return ordered_sum(picked.movedim(1, -1)).to(x.dtype)  # a fixed order per row, whatever the row count


def moe(x, gate_up, down, top_idx, top_w, summed: bool = True):
    """Dispatcher: the fused Triton kernel for int4 experts on the Triton path; in torch, every
    expert on every token for small models, gathered pairs for small pair volumes, the per-expert
    loop otherwise (the real model). Returns [T, D] in x's dtype; with summed=False the fused
    kernel may instead return each token's weighted expert outputs [T, K, D] fp32 for the next
    kernel to sum (`layer_norms.mlp_out_norms` does: one launch a layer fewer)."""
    if use_triton(x, "moe") and isinstance(gate_up, Int4Weight) and isinstance(down, Int4Weight):
        from flashdesk.kernels.moe_triton import fused_moe

        return faulty("moe", fused_moe(x, gate_up, down, top_idx, top_w, summed))
    per_pair = (gate_up.shape[1] * gate_up.shape[2] + down.shape[1] * down.shape[2]) * x.element_size()
    if x.device.type == "cpu" and gate_up.shape[0] * per_pair <= EVERY_EXPERT_LIMIT_BYTES:
        return moe_every_expert(x, gate_up, down, top_idx, top_w)
    if top_idx.numel() * per_pair <= GATHER_LIMIT_BYTES:
        return moe_gathered(x, gate_up, down, top_idx, top_w)
    return moe_reference(x, gate_up, down, top_idx, top_w)


def routed_moe(
    x, gate_up, down, router_x: torch.Tensor, router, top_k: int, per_expert_scale: torch.Tensor, summed: bool = True
):
    """The router's logits linear(router_x, router) [T, E], their top-k (router.route), then `moe`.
    On the fused path a decode or verify block's router projection, its routing and the grouping of
    its pairs by expert are one kernel."""
    fused = all(use_triton(x, family) for family in ("moe", "router", "linear"))  # its router runs theirs
    if fused and isinstance(gate_up, Int4Weight) and isinstance(down, Int4Weight):
        from flashdesk.kernels.moe_triton import fused_router_moe

        return faulty("moe", fused_router_moe(x, gate_up, down, router_x, router, top_k, per_expert_scale, summed))
    top_w, top_idx = route(linear(router_x, router), top_k, per_expert_scale)
    return moe(x, gate_up, down, top_idx, top_w, summed)


def dense_and_routed_moe(
    dense: DenseMlp, x, gate_up, down, router_x: torch.Tensor, router, top_k: int, per_expert_scale: torch.Tensor
):
    """A MoE layer's two feed-forwards, for layer_norms.mlp_out_norms: (m, experts), m the dense
    MLP's output [T, D] and experts each token's weighted expert outputs [T, K, D] fp32 (or [T, D]).
    On the fused path, where the dense MLP's intermediate is a whole number of experts' (Gemma 4
    26B-A4B: 2,112 = 3 x 704), its chunks run as extra slots of the expert launch, two launches a
    layer fewer: m is then its per-chunk fp32 partials [S, T, D], summed in order and rounded
    where they are read."""
    fused = all(use_triton(x, family) for family in ("moe", "router", "linear"))
    if fused and isinstance(gate_up, Int4Weight) and isinstance(down, Int4Weight):
        from flashdesk.kernels.moe_triton import dense_chunks, fused_router_moe

        if dense_chunks(dense, x, gate_up, down):
            experts, partials = fused_router_moe(
                x, gate_up, down, router_x, router, top_k, per_expert_scale, summed=False, dense=dense
            )
            return faulty("moe", (partials, experts))
    m = linear(glu_linear(dense.x, dense.gate_up, "gelu_tanh"), dense.down)
    return m, routed_moe(x, gate_up, down, router_x, router, top_k, per_expert_scale, summed=False)
