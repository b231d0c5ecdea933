"""Attention of a block of queries over the cached keys: causal, optionally sliding-window, GQA.

The plain-torch reference below is the definition. `attention()` takes keys and values given
explicitly (prefill chunks, the drafter; a full layer's fp8 cache as stored, with its scales) and
runs the Triton flash-attention kernel on the Triton path; decode and verify steps read the KV cache
in place through `attention_triton.decode_attention` (chosen by the cache, which knows its layout).
"""

from __future__ import annotations

import torch

from flashdesk.kernels.backend import faulty, use_triton

DECODE_QUERIES = 16  # the most queries a decode / verify attention call takes: a DFlash block
SCORE_BUDGET_BYTES = 256 << 20  # peak score memory of one attention call; longer blocks go in passes
SCORE_MATRICES_AT_PEAK = 2  # fp32 scores (masked in place) and their softmax alive together
MASK_BYTES_PER_ENTRY = 2  # the bool mask and, while it is built, a second one, per (query, key)


def query_rows_per_pass(num_heads: int, keys: int) -> int:
    """How many queries one pass takes so its [heads, rows, keys] scores stay within the budget."""
    per_row = int(SCORE_MATRICES_AT_PEAK * num_heads * keys * 4) + keys * MASK_BYTES_PER_ENTRY
    return max(1, SCORE_BUDGET_BYTES // per_row)


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """q [T, Hq, D], k/v [S, Hkv, D], positions [T] and [S] -> [T, Hq, D].

    Causal: a query at p sees keys at kp <= p and, with a window W, kp > p - W (W keys including
    itself). Non-causal (the drafter's full layers): every key, or those within W on either side.
    Scores and softmax in fp32; the probabilities are cast to v's dtype for the value product.
    """
    t, hq, d = q.shape
    rows = query_rows_per_pass(hq, k.shape[0])
    if t > rows:  # a long prefill chunk: bound the score memory, same result
        return torch.cat(
            [
                attention_reference(q[i : i + rows], k, v, q_pos[i : i + rows], k_pos, window, scale, causal)
                for i in range(0, t, rows)
            ]
        )
    hkv = k.shape[1]
    group = hq // hkv
    qg = q.view(t, hkv, group, d).permute(1, 2, 0, 3)  # [Hkv, G, T, D]
    kt = k.permute(1, 2, 0).unsqueeze(1)  # [Hkv, 1, D, S]
    scores = torch.matmul(qg, kt).float() * scale  # [Hkv, G, T, S], a new tensor: masked in place
    blocked = _blocked(q_pos, k_pos, window, causal)
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    del scores  # before the cast: two score matrices at most are alive at once
    probs = probs.to(v.dtype)
    out = torch.matmul(probs, v.permute(1, 0, 2).unsqueeze(1))  # [Hkv, G, T, D]
    return out.permute(2, 0, 1, 3).reshape(t, hq, d)


def _blocked(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, causal: bool) -> torch.Tensor | None:
    """[T, S] bool: the (query, key) pairs a query may not see (None: it sees every key)."""
    qp, kp = q_pos[:, None], k_pos[None, :]
    blocked = kp > qp if causal else None
    if window is not None:
        far = kp <= qp - window
        if not causal:
            far |= kp >= qp + window
        blocked = far if blocked is None else blocked.logical_or_(far)
    return blocked


def attention(q, k, v, q_pos, k_pos, window, scale, causal=True, k_scale=None, v_scale=None):
    """Dispatcher: Triton's prefill kernel on the Triton path, the reference otherwise. With
    k_scale/v_scale [S, Hkv], k and v are fp8 as a cache stores them: the kernel reads them where
    they are, the reference dequantizes them first."""
    if use_triton(q, "prefill_attention"):
        from flashdesk.kernels.attention_triton import prefill_attention

        return faulty(
            "prefill_attention", prefill_attention(q, k, v, q_pos, k_pos, window, scale, causal, k_scale, v_scale)
        )
    if k_scale is not None:
        k = (k.float() * k_scale.unsqueeze(-1)).to(q.dtype)
        v = (v.float() * v_scale.unsqueeze(-1)).to(q.dtype)
    return attention_reference(q, k, v, q_pos, k_pos, window, scale, causal)


def attention_in_place(q, cache_k, cache_v, k_scale, v_scale, start, window, capacity, scale, max_context, causal=True):
    """Attention of a decode or verify block whose K/V a norm kernel already wrote into the cache,
    over the cache where it lies (`attention_triton.decode_attention`). The Triton path alone has
    this form: callers check backend.STEP_FAMILIES first and take `attention` otherwise."""
    from flashdesk.kernels.attention_triton import decode_attention

    return decode_attention(
        q, cache_k, cache_v, k_scale, v_scale, start, window, capacity, scale, max_context, causal=causal
    )
