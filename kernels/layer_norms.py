"""The chains of RMSNorms between a Gemma 4 layer's blocks, each one kernel on the Triton path.

After attention a layer adds the normalized output to the residual stream, then normalizes that
row three more times for its three readers (dense MLP, experts, router); after the MLPs it
normalizes both MLP outputs, adds them, normalizes the sum, adds the residual, scales by the layer
scalar, and the next layer starts by normalizing the result again. Each norm reduces the same
row, so one program runs a whole chain on its rows: 2 kernels a layer instead of 8 norms and 2 multiplies
(at batch 1 each launch costs more than its bytes). The Triton kernels round where these torch
references round; rows are reduced on their own (batch invariant).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashdesk.kernels.backend import faulty, use_triton
from flashdesk.kernels.int4 import Int4Weight
from flashdesk.kernels.linear import linear
from flashdesk.kernels.norm import rms_norm as norm
from flashdesk.kernels.router import ordered_sum


class RouterInput(NamedTuple):
    """The MoE's two norms of the residual row: pre_feedforward_layernorm_2's weight, and the
    router's input norm(h) * scale * scalar (its weightless norm, times a vector, times a number)."""

    experts_weight: torch.Tensor
    router_scale: torch.Tensor
    router_scalar: float


def attention_out_reference(a, residual, eps, post_attention, pre_feedforward, moe: RouterInput | None):
    h = norm(a, post_attention, eps, residual=residual)
    outputs = [h, norm(h, pre_feedforward, eps)]
    if moe is not None:
        outputs += [norm(h, moe.experts_weight, eps), norm(h, None, eps) * moe.router_scale * moe.router_scalar]
    return tuple(outputs)


def attention_out_norms(
    a: torch.Tensor,
    residual: torch.Tensor,
    eps: float,
    post_attention: torch.Tensor,
    pre_feedforward: torch.Tensor,
    moe: RouterInput | None = None,
) -> tuple:
    """h = residual + norm(a) * post_attention, then the MLP input norm(h) * pre_feedforward and,
    with `moe`, the experts' input and the router's input: (h, x) or (h, x, experts_x, router_x).
    Rows [T, D]; norm weights fp32."""
    if use_triton(a, "attention_out_norms"):
        from flashdesk.kernels.layer_norms_triton import attention_out_triton

        return faulty(
            "attention_out_norms", attention_out_triton(a, residual, eps, post_attention, pre_feedforward, moe)
        )
    return attention_out_reference(a, residual, eps, post_attention, pre_feedforward, moe)


FUSED_O_PROJ = ("o_proj_norms", "linear", "attention_out_norms")  # its kernel stands in for all three


def o_proj_and_norms(
    a: torch.Tensor,
    o_proj,
    residual: torch.Tensor,
    eps: float,
    post_attention: torch.Tensor,
    pre_feedforward: torch.Tensor,
    moe: RouterInput | None = None,
) -> tuple:
    """attention_out_norms(linear(a, o_proj), residual, ...): the attention output's projection and
    the norms after it. On the Triton path a decode step's one row with an int4 projection runs as
    one kernel (the norms in the projection's last program, kernels/o_proj_triton.py); blocks take
    the two kernels, whose chain code and layout are the fused kernel's (the same bits)."""
    if (
        isinstance(o_proj, Int4Weight)
        and a.dim() == 2
        and all(use_triton(a, family) for family in FUSED_O_PROJ)
        and residual.shape == (a.shape[0], o_proj.shape[0])
    ):
        from flashdesk.kernels.o_proj_triton import fusable, o_proj_norms_triton

        if fusable(a.shape[0], o_proj.shape[0], a.shape[1], o_proj.group_size):
            out = o_proj_norms_triton(a, o_proj, residual, eps, post_attention, pre_feedforward, moe)
            return faulty("o_proj_norms", out)
    return attention_out_norms(linear(a, o_proj), residual, eps, post_attention, pre_feedforward, moe)


class MlpOutWeights(NamedTuple):
    """post_feedforward_layernorm_1 and _2 (None without MoE), post_feedforward_layernorm, the
    layer scalar (a one-element tensor), and the norm that reads the result next (the next
    layer's input_layernorm, or the final norm)."""

    dense: torch.Tensor | None
    experts: torch.Tensor | None
    output: torch.Tensor
    layer_scalar: torch.Tensor
    next_norm: torch.Tensor


def mlp_out_reference(dense, experts, residual, eps, w: MlpOutWeights):
    if dense.dim() == 3:  # per-chunk fp32 partials: summed in chunk order, rounded
        dense = ordered_sum(dense.movedim(0, -1)).to(residual.dtype)
    m = dense
    if experts is not None and experts.dim() == 3:
        experts = ordered_sum(experts.movedim(1, -1)).to(dense.dtype)
    if experts is not None:
        m = norm(experts, w.experts, eps, residual=norm(dense, w.dense, eps))
    h = norm(m, w.output, eps, residual=residual, scale=w.layer_scalar)
    return h, norm(h, w.next_norm, eps)


def mlp_out_norms(
    dense: torch.Tensor, experts: torch.Tensor | None, residual: torch.Tensor, eps: float, w: MlpOutWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output h = (residual + norm(m) * output) * layer_scalar, where m is the dense
    MLP's output or, with the experts' output, norm(dense) * w.dense + norm(experts) * w.experts;
    and norm(h) * next_norm, the next layer's input. Rows [T, D]. `experts` may also be each
    token's weighted expert outputs [T, K, D] fp32 (`moe(..., summed=False)`): they are summed here
    in top-k order and rounded, as the experts' own sum would be, so the MoE needs no sum kernel.
    `dense` may likewise be the dense MLP's per-chunk partials [S, T, D] fp32
    (`moe.dense_and_routed_moe`), summed here in chunk order and rounded."""
    if use_triton(dense, "mlp_out_norms"):
        from flashdesk.kernels.layer_norms_triton import mlp_out_triton

        return faulty("mlp_out_norms", mlp_out_triton(dense, experts, residual, eps, w))
    return mlp_out_reference(dense, experts, residual, eps, w)
