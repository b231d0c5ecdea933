"""A Gemma 4 layer's attention inputs from its input norm: the fused q/k/v projection, then the
head norms, RoPE and the K/V store (`norm.qkv_norms`).

On the Triton path a decode step's row with an int4 projection and a cache to store into runs all
of it as one kernel (kernels/qkv_triton.py): the head norms run inside the projection's launch,
each head as soon as its outputs are done. A block (a verify block's rows would run one after
another there) takes the projection and the head-norm kernel, which normalizes the same pairs in
the same tile and warps: a decode row and the same row in a block round alike.
"""

from __future__ import annotations

import torch

from flashdesk.kernels.backend import faulty, use_triton
from flashdesk.kernels.int4 import Int4Weight
from flashdesk.kernels.kv_write import KVSlots
from flashdesk.kernels.linear import linear
from flashdesk.kernels.norm import qkv_norms

FAMILIES = ("qkv_heads", "linear", "head_norms", "kv_write")  # its kernel stands in for all four


def _fused(x: torch.Tensor, weight, head_dim: int, into: KVSlots) -> bool:
    if not isinstance(weight, Int4Weight) or x.dim() != 2:
        return False
    if not all(use_triton(x, family) for family in FAMILIES) or x.shape[0] > into.capacity:
        return False
    from flashdesk.kernels.qkv_triton import fusable

    return fusable(x.shape[0], weight.shape[0], x.shape[1], head_dim, weight.group_size)


def attention_inputs(
    x: torch.Tensor,
    weight,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    k_eq_v: bool,
    into: KVSlots | None = None,
) -> tuple:
    """qkv_norms(linear(x, weight), ...): q [T, H, D], and k, v [T, Hkv, D], or (q, None, None)
    with k and v stored into `into`."""
    if into is not None and _fused(x, weight, head_dim, into):
        from flashdesk.kernels.qkv_triton import qkv_heads_triton

        q = qkv_heads_triton(x, weight, q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v, into)
        return faulty("qkv_heads", q), None, None
    return qkv_norms(linear(x, weight), q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v, into)
