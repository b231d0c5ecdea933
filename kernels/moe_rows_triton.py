"""The loops of the fused MoE's expert stages (moe_triton, moe_small_triton): one slot's rows through one block
of its weight, the int4 decoding and the GeGLU written inline (Triton's interpreter, which runs the
CPU tests, pays per nested call). A slot is an expert's (token, expert) pairs or, on the small path,
one expert-sized chunk of the layer's dense MLP over every token; each kind calls its loop with its
own compile-time strides, so neither pays for the other's addressing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from flashdesk.kernels.linear_triton import gated_product, gelu_tanh

if TYPE_CHECKING:
    import torch

    from flashdesk.kernels.int4 import Int4Weight

# A tiny expert (the test models) whose whole [BLOCK_M, N, K] small-path tile has at most this many
# elements is one tile: a slot is one item a stage, of one step (no spills at D=64, I=24 on sm_86/89).
WHOLE_EXPERT = 8192


def tiles(config: tuple, n: int, k: int, small: bool) -> tuple:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for an [N, K] expert matrix: the path's config, or for a
    tiny expert the whole matrix (small path) or blocks no wider than it (tl.dot needs 16). From the
    shapes only, so every token count of a path runs the same tiles (batch invariance)."""
    bm, bn, bk, warps = config
    whole_n, whole_k = triton.next_power_of_2(n), triton.next_power_of_2(k)
    if small and bm * whole_n * whole_k <= WHOLE_EXPERT:
        return bm, whole_n, whole_k, warps
    return bm, min(bn, max(whole_n, 16)), min(bk, max(whole_k, 16)), warps


def zero_arg(w: Int4Weight) -> torch.Tensor:
    """The zero-point pointer argument; symmetric weights pass `packed` (never read)."""
    return w.packed if w.zero is None else w.zero


@triton.jit
def gate_up_rows(
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    pair_ptr,
    h_ptr,
    begin,
    end,
    block,
    D: tl.constexpr,
    I: tl.constexpr,
    GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    UP_ROWS: tl.constexpr,
    DENSE_ROWS: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Rows begin..end of h for block `block` of I, from gate rows at packed_ptr and up rows UP_ROWS
    below them: an expert's pairs (x rows by pair), or with DENSE_ROWS a dense chunk's tokens."""
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    if USE_DOT:  # weight tiles [BLOCK_K, BLOCK_N], as tl.dot takes them
        wn = n[None, :]
        wk = kk[:, None]
    else:  # [BLOCK_N, BLOCK_K], against [BLOCK_M, 1, BLOCK_K] rows
        wn = n[:, None]
        wk = kk[None, :]
    # int4 addressing (int4.py) at k = 0, set up once
    words = packed_ptr + wn * (D // 8) + wk // 8
    up_words: tl.constexpr = UP_ROWS * (D // 8)
    shift = (wk & 7) << 2  # 4 * (k % 8)
    gate_groups = wn * (D // GROUP)
    up_groups = gate_groups + UP_ROWS * (D // GROUP)
    n_ok = wn < I
    ty: tl.constexpr = h_ptr.dtype.element_ty
    for m0 in range(begin, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        m_ok = rows < end
        if DENSE_ROWS:
            tokens = (rows - begin).to(tl.int64)
        else:
            tokens = (tl.load(pair_ptr + rows, mask=m_ok, other=0) // TOP_K).to(tl.int64)
        x_rows = x_ptr + tokens[:, None] * D + kk[None, :]
        if USE_DOT:
            gate = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
            up = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        else:
            gate3 = tl.full([BLOCK_M, BLOCK_N, BLOCK_K], 0.0, tl.float32)
            up3 = tl.full([BLOCK_M, BLOCK_N, BLOCK_K], 0.0, tl.float32)
        for k0 in range(0, D, BLOCK_K):
            x_ok, w_ok = m_ok[:, None], n_ok
            if D % BLOCK_K:  # a K tail (tiny experts only)
                x_ok = x_ok & (kk < D - k0)[None, :]
                w_ok = w_ok & (wk < D - k0)
            x = tl.load(x_rows + k0, mask=x_ok, other=0.0)
            group = (k0 + wk) // GROUP
            qg = ((tl.load(words + k0 // 8, mask=w_ok, other=0) >> shift) & 0xF) - 8
            qu = ((tl.load(words + (up_words + k0 // 8), mask=w_ok, other=0) >> shift) & 0xF) - 8
            if HAS_ZERO:
                qg -= tl.load(zero_ptr + gate_groups + group, mask=w_ok, other=0)
                qu -= tl.load(zero_ptr + up_groups + group, mask=w_ok, other=0)
            wg = qg.to(tl.float32) * tl.load(scale_ptr + gate_groups + group, mask=w_ok, other=0.0).to(tl.float32)
            wu = qu.to(tl.float32) * tl.load(scale_ptr + up_groups + group, mask=w_ok, other=0.0).to(tl.float32)
            if USE_DOT:
                if DOT_FP32:  # the interpreter's bf16 dot is broken; fp32 activations stay fp32
                    x = x.to(tl.float32)
                    gate = tl.dot(x, wg, gate, input_precision="ieee")
                    up = tl.dot(x, wu, up, input_precision="ieee")
                else:
                    gate = tl.dot(x, wg.to(x.dtype), gate)
                    up = tl.dot(x, wu.to(x.dtype), up)
            else:
                xf = x.to(tl.float32)[:, None, :]
                gate3 += xf * wg[None, :, :]
                up3 += xf * wu[None, :, :]
        if not USE_DOT:
            gate = tl.sum(gate3, axis=2)
            up = tl.sum(up3, axis=2)
        if DENSE_ROWS:  # gate, up, act(gate) and the product rounded, as linear_triton's GLU epilogue
            h = gated_product(gate.to(ty), up.to(ty), "gelu_tanh")
        else:
            h = gelu_tanh(gate) * up
        tl.store(
            h_ptr + rows[:, None].to(tl.int64) * I + n[None, :],
            h.to(ty),
            mask=m_ok[:, None] & (n < I)[None, :],
        )


@triton.jit
def down_rows(
    h_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    pair_ptr,
    weight_ptr,
    y_ptr,
    begin,
    end,
    block,
    D: tl.constexpr,
    I: tl.constexpr,
    GROUP: tl.constexpr,
    ROW: tl.constexpr,
    DENSE_ROWS: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    H_CACHE: tl.constexpr = "",
):
    """Rows begin..end of h through I columns of a down weight whose rows are ROW wide, for block
    `block` of D: an expert's pairs, weighted, into y's pair rows; or with DENSE_ROWS a dense
    chunk's rows, unweighted, into y's rows of the same index. H_CACHE ".cg": h was just written
    by other programs of the same launch (read it past L1)."""
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    if USE_DOT:  # weight tiles oriented as in _gate_up_kernel
        wn = n[None, :]
        wk = kk[:, None]
    else:
        wn = n[:, None]
        wk = kk[None, :]
    words = packed_ptr + wn * (ROW // 8) + wk // 8
    shift = (wk & 7) << 2  # 4 * (k % 8)
    groups = wn * (ROW // GROUP)
    n_ok = wn < D
    for m0 in range(begin, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        m_ok = rows < end
        h_rows = h_ptr + rows[:, None].to(tl.int64) * I + kk[None, :]
        if USE_DOT:
            acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        else:
            acc3 = tl.full([BLOCK_M, BLOCK_N, BLOCK_K], 0.0, tl.float32)
        for k0 in range(0, I, BLOCK_K):
            h_ok, w_ok = m_ok[:, None], n_ok
            if I % BLOCK_K:  # a K tail (tiny experts only)
                h_ok = h_ok & (kk < I - k0)[None, :]
                w_ok = w_ok & (wk < I - k0)
            h = tl.load(h_rows + k0, mask=h_ok, other=0.0, cache_modifier=H_CACHE)
            group = groups + (k0 + wk) // GROUP
            q = ((tl.load(words + k0 // 8, mask=w_ok, other=0) >> shift) & 0xF) - 8
            if HAS_ZERO:
                q -= tl.load(zero_ptr + group, mask=w_ok, other=0)
            w = q.to(tl.float32) * tl.load(scale_ptr + group, mask=w_ok, other=0.0).to(tl.float32)
            if USE_DOT:
                if DOT_FP32:
                    acc = tl.dot(h.to(tl.float32), w, acc, input_precision="ieee")
                else:
                    acc = tl.dot(h, w.to(h.dtype), acc)
            else:
                acc3 += h.to(tl.float32)[:, None, :] * w[None, :, :]
        if not USE_DOT:
            acc = tl.sum(acc3, axis=2)
        if DENSE_ROWS:  # its own row of y, unweighted
            y_rows = rows.to(tl.int64)
            y = acc
        else:
            pairs = tl.load(pair_ptr + rows, mask=m_ok, other=0)
            y_rows = pairs.to(tl.int64)
            y = acc * tl.load(weight_ptr + pairs, mask=m_ok, other=0.0)[:, None]
        tl.store(y_ptr + y_rows[:, None] * D + n[None, :], y, mask=m_ok[:, None] & (n < D)[None, :])
