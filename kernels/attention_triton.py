"""Triton attention: decode/verify over the KV cache in place, flash-attention prefill, the cache write.

Decode/verify (`decode_attention`, 1..16 queries): a program owns a fixed 16-row tile of (query
head, query) rows that share one KV head (GQA: a decode step's 8 heads of a full layer read the
keys once), padding rows masked. Every row is reduced on its own in a fixed order, so a query's
bits never depend on how many queries came with it or where its row sits in the tile (batch
invariance: a verify block computes exactly what plain decoding computes). Keys are read where the
cache stores them (slot = position % capacity) in chunks of BLOCK_N aligned to absolute positions,
and a chunk with no visible key for a row leaves that row's running (max, sum, acc) bit for bit as
it was. The keys are cut into splits of SPLIT positions aligned at 0 (flash-decoding), whatever
the cache's capacity, so the work follows the length: a step at 4K positions runs 16 splits a KV
head whether the cache holds 8K or 256K. The grid has P split columns (P from the static context
size, at most MAX_SPLITS); program (row tile, j) reduces, in position order, the splits s with
s % P == j into fp32 partials (a split is assigned by its absolute index, never by the block's
rows, so batch invariance holds), and exits at once when the block's keys end before its first
split. A second kernel combines the partials of the programs that ran, in position order of their
first split; when the static context is a single split, the split kernel normalizes and writes the
output itself. The grid depends on shapes and the static context size only, and the block's start
is read on the device, so one captured CUDA graph replays at every length.

fp8 e4m3 is handled as raw bytes with our own bit-level codec: Triton's fp8e4nv type does not exist
below sm_89 (RTX 3090), and the encoder rounds exactly as torch does (nearest even, NaN past 464,
as c10's Float8_e4m3fn), so the Triton cache write is bit-identical to the torch one. The decode
loop turns each byte into the fp16 of its value times 2**-8 (exact: fp16 is e4m3 with a wider
exponent), four bytes per PTX call on a GPU (`_e4m3_to_f16`) and by the same bit operations under
the interpreter, and runs its dots in fp16 (the query converted once: a normed, roped query is far
inside fp16's range). Scales are factored out of the dots: scores times the key's scale,
probabilities times the value's scale.

Prefill (`prefill_attention`): flash-attention over explicit K/V with positions, BLOCK_M queries x
BLOCK_N keys per step, key range found by binary search on the increasing key positions.

Tensor-core operands are q's dtype (bf16; fp8 keys convert to bf16 exactly), fp32 under the
interpreter, whose bf16 dot is broken.

The CPU tests run these kernels through Triton's interpreter, which pays per executed op and far more
per nested @triton.jit call, per program: helpers are inlined in the loops, reductions are few,
and tiny test heads (<= TINY_HEAD_DIM) take wider key chunks; a cache-write program takes many rows.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import (
    ARRIVAL_COUNTERS,
    LAUNCH_STAGES,
    MAX_REGISTERS,
    CompileSpec,
    arrival_counters,
    device_start,
    faulty,
    interpreted,
    pdl_options,
)
from flashdesk.kernels.grid_dependency import enter

BLOCK_T = 16  # query rows of a decode tile: one tile takes a whole verify block (attention.DECODE_QUERIES)
SPLIT = 128  # positions per flash-decoding split, for every layer and cache size
MAX_SPLITS = 64  # split columns of the grid: bounds the fp32 partials (<= 32 MB at T=16, D=512)
# Up to this many split columns the last split program of a row block combines the partials itself:
# one launch fewer, at most 18 partials to read. Every sliding layer's window fits (the target's 1,024
# positions span at most 10 splits, the drafter's 2,048 at most 18).
COMBINE_IN_SPLIT = 18
COMBINE_BLOCK_D = 64  # columns per combine program: 16 heads x D/64 programs
COMBINE_WARPS = 4
KV_WRITE_ELEMENTS = 1024  # values per cache-write program (rows of D), 8 a thread
KV_WRITE_WARPS = 4
LOG2E = math.log2(math.e)
TINY_HEAD_DIM = 32  # up to this head dim, wider key chunks (the real heads are 128 and up)


class DecodeConfig(NamedTuple):
    block_n: int
    num_warps: int
    num_stages: int = LAUNCH_STAGES


class PrefillConfig(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = LAUNCH_STAGES


def decode_config(head_dim: int, fp8: bool = False) -> DecodeConfig:
    """8 warps over 16-key chunks for a bf16 cache (wider ones put the real head dims near 255
    registers on some cards). An fp8 cache takes 64-key chunks: the 16 x 16 score tile of a 16-key
    chunk is one warp's MMA, so 8 warps each converted the whole chunk's K (8 times the work); 64
    keys give each warp its own 8 columns (32 still gave two warps each). At D=512 two stages: three
    took 151 KB of shared memory, over the 99 KB of an RTX 3090/4090/5090. With the packed
    conversion (`_e4m3_to_f16`), about 16 SASS instructions per key at D=256 and 28 at D=512, as
    against 17 and 26 with a bf16 cache. Tiny heads (test models) take 64-key chunks: fewer steps,
    no more registers than D=128's."""
    if head_dim <= TINY_HEAD_DIM:
        return DecodeConfig(64, 4)
    if fp8 and head_dim >= 256:
        return DecodeConfig(64, 8, 2 if head_dim >= 512 else LAUNCH_STAGES)
    return DecodeConfig(16, 8 if head_dim >= 128 else 4)


def prefill_config(head_dim: int) -> PrefillConfig:
    """Tiny heads (test models) take 64 x 64 tiles: fewer programs and steps, few registers."""
    if head_dim >= 512:  # two stages: three of [32, 512] K and V tiles took 149 KB of shared memory,
        return PrefillConfig(16, 32, 8, 2)  # over the 99 KB a block may have on an RTX 3090/4090/5090
    if head_dim >= 256:
        return PrefillConfig(32, 32, 8)
    if head_dim >= 128:
        return PrefillConfig(32, 32, 4)
    if head_dim > TINY_HEAD_DIM:
        return PrefillConfig(32, 16, 4)
    return PrefillConfig(64, 64, 4)


def decode_split(head_dim: int, fp8: bool = False) -> int:
    """Positions per split: SPLIT, a whole number of key chunks (never from the length or capacity)."""
    block_n = decode_config(head_dim, fp8).block_n
    return triton.cdiv(SPLIT, block_n) * block_n


def decode_num_splits(window: int | None, max_context: int, split: int) -> int:
    """Grid columns: one per split of the context up to MAX_SPLITS (a program then takes every
    P-th split), or for a ring only as many as one block can touch."""
    splits = min(triton.cdiv(max_context, split), MAX_SPLITS)
    if window is None:
        return splits
    return min(splits, triton.cdiv(window + BLOCK_T - 1, split) + 1)


# ----------------------------------------------------------------------------- fp8 e4m3 codec


@triton.jit
def _e4m3_encode(y):
    """fp32 -> e4m3fn byte, rounding to nearest even, saturating to NaN past 464 (torch's rule)."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    odd = (mag >> 20) & 1
    normal = (mag - (120 << 23) + 0x7FFFF + odd) >> 20
    # below 2**-6: adding 2**14 rounds the value to a multiple of 2**-9 (the subnormal step), RNE
    sub = (mag.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)
    code = tl.where(mag < (121 << 23), sub, normal)
    code = tl.where(mag >= (1087 << 20), 0x7F, code)
    return (code | sign).to(tl.uint8)


# fp16 pairs from four e4m3 bytes ($2): see _e4m3_to_f16
E4M3_TO_F16_PTX = tl.constexpr("""{
        .reg .b32 t0, t1, s0, s1;
        prmt.b32 t0, $2, $2, 0x1000;
        prmt.b32 t1, $2, $2, 0x3020;
        shr.b32 s0, t0, 1;
        shr.b32 s1, t1, 1;
        and.b32 s0, s0, 0x3F803F80;
        and.b32 s1, s1, 0x3F803F80;
        lop3.b32 $0, t0, 0x80008000, s0, 0xEA;
        lop3.b32 $1, t1, 0x80008000, s1, 0xEA;
        }""")


@triton.jit
def _e4m3_to_f16(x, INTERPRETED: tl.constexpr):
    """e4m3 bytes -> fp16 of value * 2**-8, exactly: fp16 is e4m3 with one more exponent bit (bias
    15, not 7), subnormals included; callers fold the 2**8 into the scales. NaN is never stored.

    On a GPU four bytes per PTX call, two values per instruction: Triton packs bytes 0..3 of a
    thread's run into $2 and takes fp16 pairs (0, 1) from $0 and (2, 3) from $1, low half first. A
    byte permute puts bytes 0 and 1 in the high bytes of the two halves, where each sign already
    sits at bit 15; a shift and a mask put the 7 magnitude bits at 7..13 (tests/test_kernels_attention.py
    runs this PTX through a model of the four instructions, for every byte). The interpreter, which
    runs no PTX, computes the same bits with Triton's operations."""
    if INTERPRETED:
        x = x.to(tl.uint16)
        return (((x & 0x7F) << 7) | ((x & 0x80) << 8)).to(tl.float16, bitcast=True)
    return tl.inline_asm_elementwise(
        asm=E4M3_TO_F16_PTX, constraints="=r,=r,r", args=[x], dtype=tl.float16, is_pure=True, pack=4
    )


# ----------------------------------------------------------------------------- cache write


@triton.jit
def store_quantized(x, c_ptr, s_ptr, ok, FP8: tl.constexpr):
    """Rows x [ROWS, D] (values of the activations' dtype) stored at c_ptr: fp8 with one scale per
    row at s_ptr, or cast to the cache's dtype; `ok` masks rows. Shared with the head-norm kernel,
    which stores a decode block's K/V straight into the cache."""
    if FP8:
        x = x.to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), 1), 1e-12), 448.0)  # IEEE, as torch divides
        tl.store(c_ptr, _e4m3_encode(tl.math.div_rn(x, scale[:, None])), mask=ok[:, None])
        tl.store(s_ptr, scale, mask=ok)
    else:
        tl.store(c_ptr, x.to(c_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit(do_not_specialize=["T", "capacity"])
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    ck_ptr,
    cv_ptr,
    ks_ptr,
    vs_ptr,
    start_ptr,
    T,
    capacity,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    HKV: tl.constexpr,
    D: tl.constexpr,
    FP8: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program i: (token, head) rows i * ROWS.. of the block; quantize their K and V and store them
    at the token's slot."""
    enter(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = r < T * HKV
    t = r // HKV
    h = r % HKV
    row = ((tl.load(start_ptr).to(tl.int32) + t) % capacity) * HKV + h
    d = tl.arange(0, D)[None, :]
    cache = row[:, None] * D + d
    k = tl.load(k_ptr + (t * stride_kt + h * stride_kh)[:, None] + d, mask=ok[:, None], other=0.0)
    store_quantized(k, ck_ptr + cache, ks_ptr + row, ok, FP8)
    v = tl.load(v_ptr + (t * stride_vt + h * stride_vh)[:, None] + d, mask=ok[:, None], other=0.0)
    store_quantized(v, cv_ptr + cache, vs_ptr + row, ok, FP8)


def kv_write_triton(k, v, cache_k, cache_v, k_scale, v_scale, start: torch.Tensor, capacity: int) -> None:
    """Store K/V [T, Hkv, D] (any row strides) at slots (start + t) % capacity of contiguous caches;
    T <= capacity (the caller keeps the newest positions)."""
    t, hkv, d = k.shape
    fp8 = k_scale is not None
    _check_rows(k, v)
    _check_contiguous(cache_k, cache_v, *((k_scale, v_scale) if fp8 else ()))
    ck, cv = (cache_k.view(torch.uint8), cache_v.view(torch.uint8)) if fp8 else (cache_k, cache_v)
    ks, vs = (k_scale, v_scale) if fp8 else (k, v)  # unused pointers without scales
    rows = kv_write_rows(d)
    _kv_write_kernel[(triton.cdiv(t * hkv, rows),)](
        k,
        v,
        ck,
        cv,
        ks,
        vs,
        start,
        t,
        capacity,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        HKV=hkv,
        D=d,
        FP8=fp8,
        ROWS=rows,
        num_warps=KV_WRITE_WARPS,
        num_stages=LAUNCH_STAGES,
        **pdl_options(k.device),
    )


def kv_write_rows(head_dim: int) -> int:
    """(token, head) rows per program: KV_WRITE_ELEMENTS values, 8 a thread (a whole block of a tiny model)."""
    return max(1, KV_WRITE_ELEMENTS // head_dim)


# ----------------------------------------------------------------------------- decode / verify


@triton.jit(do_not_specialize=["T", "capacity", "P"])
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    start_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    o_ptr,
    count_ptr,
    T,
    capacity,
    window,
    split,
    P,
    qk_scale,
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    COMBINE: tl.constexpr,
    CAUSAL: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program (kv head x row block, j) of P split columns: 16 (query head, query) rows sharing one
    KV head, over the block's splits s with s % P == j, into partials (ONE_SPLIT: the only split,
    normalized into o). With COMBINE the last program of a row block to finish (count_ptr: one
    counter per row block, zero between launches) combines its partials into o, as the combine
    kernel would. Row r is query r % T of head kv_head * GROUP + r // T. Not CAUSAL (the drafter's
    full layers): every query sees the whole block."""
    enter(PDL)
    pid, j = tl.program_id(0), tl.program_id(1)
    n_rows = GROUP * T  # (query head, query) rows of one KV head
    row_blocks = (n_rows + BLOCK_T - 1) // BLOCK_T
    kv_head = pid // row_blocks
    start = tl.load(start_ptr).to(tl.int32)
    hi = start + T - 1  # last key position of the block
    lo = tl.maximum(start - window + 1, 0)  # first key position of the block
    first_split = lo // split
    mine = first_split + ((j - first_split) % P + P) % P  # this program's first split of the block
    if mine * split <= hi:  # programs past the block's end do nothing: the grid is fixed, the length is not
        r = (pid % row_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = r < n_rows
        t = r % T
        head = kv_head * GROUP + r // T
        q_pos = start + t
        d = tl.arange(0, D)
        q = tl.load(q_ptr + (t * HQ + head)[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
        elif FP8:
            q = q.to(tl.float16)
        m = tl.full([BLOCK_T], float("-inf"), tl.float32)
        l = tl.full([BLOCK_T], 0.0, tl.float32)
        acc = tl.full([BLOCK_T, D], 0.0, tl.float32)
        for split_lo in range(mine * split, hi + 1, P * split):
            first = tl.maximum(split_lo, lo // BLOCK_N * BLOCK_N)
            for c in range(first, tl.minimum(split_lo + split, hi + 1), BLOCK_N):
                k_pos = c + tl.arange(0, BLOCK_N)
                k_ok = (k_pos >= lo) & (k_pos <= hi)
                row = (k_pos % capacity) * (HQ // GROUP) + kv_head  # the key's ring slot, this KV head
                kv = row[:, None] * D + d[None, :]
                k = tl.load(k_ptr + kv, mask=k_ok[:, None], other=0)
                if FP8:
                    k = _e4m3_to_f16(k, DOT_FP32)
                    k_scale = tl.load(ks_ptr + row, mask=k_ok, other=0.0) * 256.0 * qk_scale
                    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * k_scale[None, :]
                else:
                    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * qk_scale
                delta = q_pos[:, None] - k_pos[None, :]
                # a query's visible keys lie in [lo, hi], so k_ok is implied; padding rows are never stored
                if CAUSAL:
                    s = tl.where((delta >= 0) & (delta < window), s, float("-inf"))
                else:
                    s = tl.where(k_ok[None, :], s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, 1))
                base = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: -inf - -inf would be NaN
                alpha = tl.where(m_new > m, tl.exp2(m - base), 1.0)  # exactly 1 when a chunk adds nothing
                p = tl.exp2(s - base[:, None])  # exactly 0 where masked
                l = l * alpha + tl.sum(p, 1)
                v = tl.load(v_ptr + row[:, None] * D + d[None, :], mask=k_ok[:, None], other=0)
                if FP8:  # as k
                    v = _e4m3_to_f16(v, DOT_FP32)
                    p = p * (tl.load(vs_ptr + row, mask=k_ok, other=0.0) * 256.0)[None, :]
                acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None], input_precision="ieee")
                m = m_new
        if ONE_SPLIT:  # what the combine computes for one split (num = acc, den = l), without it
            out = acc / tl.where(row_ok, l, 1.0)[:, None]  # padding rows: nothing to normalize
            tl.store(
                o_ptr + (t * HQ + head)[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None]
            )
        else:
            part = (j * T + t) * HQ + head
            tl.store(m_ptr + part, m, mask=row_ok)
            tl.store(l_ptr + part, l, mask=row_ok)
            tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
            if COMBINE:
                tl.debug_barrier()  # all of this program's partials are written before the release below
                ran = tl.minimum(hi // split - first_split + 1, P)
                if tl.atomic_add(count_ptr + pid, 1, sem="acq_rel") == ran - 1:  # the others' are visible
                    out = _combine(m_ptr, l_ptr, acc_ptr, t, head, row_ok, d, first_split, ran, P, T, HQ, D)
                    tl.store(
                        o_ptr + (t * HQ + head)[:, None] * D + d[None, :],
                        out.to(o_ptr.dtype.element_ty),
                        mask=row_ok[:, None],
                    )
                    tl.atomic_xchg(count_ptr + pid, 0, sem="relaxed")  # the next launch starts from zero


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, t, head, row_ok, cols, first_split, ran, P, T, HQ: tl.constexpr, D: tl.constexpr):
    """Rows (query t, head) [BLOCK_T] over columns `cols`: each row sums its non-empty partials,
    those of the `ran` split programs that ran, in position order of their first split. The
    partials are read past L1 (a fused combine reads what other programs just wrote)."""
    top = tl.full(t.shape, float("-inf"), tl.float32)
    for i in range(0, ran):
        part = (((first_split + i) % P) * T + t) * HQ + head
        top = tl.maximum(top, tl.load(m_ptr + part, mask=row_ok, other=float("-inf"), cache_modifier=".cg"))
    num = tl.full([t.shape[0], cols.shape[0]], 0.0, tl.float32)
    den = tl.full(t.shape, 0.0, tl.float32)
    for i in range(0, ran):
        part = (((first_split + i) % P) * T + t) * HQ + head
        m = tl.load(m_ptr + part, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        seen = m > float("-inf")  # an empty split adds nothing, not even a zero
        w = tl.exp2(m - tl.where(seen, top, 0.0))
        acc = tl.load(acc_ptr + part[:, None] * D + cols[None, :], mask=seen[:, None], other=0.0, cache_modifier=".cg")
        num = tl.where(seen[:, None], num + w[:, None] * acc, num)
        den = tl.where(seen, den + w * tl.load(l_ptr + part, mask=seen, other=0.0, cache_modifier=".cg"), den)
    return num / tl.where(row_ok, den, 1.0)[:, None]  # padding rows: nothing to normalize


@triton.jit(do_not_specialize=["T", "P"])
def _decode_combine_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    start_ptr,
    o_ptr,
    T,
    window,
    split,
    P,
    HQ: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program (head, column block): `_combine` of the head's T rows."""
    enter(PDL)
    head, col = tl.program_id(0), tl.program_id(1)
    start = tl.load(start_ptr).to(tl.int32)
    first_split = tl.maximum(start - window + 1, 0) // split
    ran = tl.minimum((start + T - 1) // split - first_split + 1, P)
    rows = tl.arange(0, BLOCK_T)
    row_ok = rows < T
    d = col * BLOCK_D + tl.arange(0, BLOCK_D)
    out = _combine(m_ptr, l_ptr, acc_ptr, rows, head, row_ok, d, first_split, ran, P, T, HQ, D)
    tl.store(o_ptr + (rows * HQ + head)[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def _check_rows(*tensors):
    for x in tensors:
        if x.stride(-1) != 1:
            raise ValueError("attention tensors need a contiguous last (head) dimension")


def _check_contiguous(*tensors):
    if not all(x.is_contiguous() for x in tensors):
        raise ValueError("KV caches and their scales must be contiguous [capacity, Hkv, D] / [capacity, Hkv]")


def decode_attention(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    k_scale,
    v_scale,
    start,
    window: int | None,
    capacity: int,
    scale: float,
    max_context: int,
    split: int | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """q [T <= 16, Hq, D] at positions start..start+T-1 over the cache, whose K/V already hold them.

    cache_k/v contiguous [capacity, Hkv, D] (bf16/fp32, or fp8 with fp32 scales [capacity, Hkv]);
    a query at p sees positions max(0, p - window + 1)..p (all up to p without a window), read at
    slot position % capacity; with causal=False (no window) every query sees 0..start+T-1. `split`
    overrides the positions per split (a multiple of the chunk size; tests). No host sync when
    `start` is a device tensor. Returns [T, Hq, D] in q's dtype.
    """
    t, hq, d = q.shape
    hkv = cache_k.shape[1]
    if t > BLOCK_T or hq % hkv or d & (d - 1):
        raise ValueError(f"decode attention takes <= {BLOCK_T} queries, Hq a multiple of Hkv, a power-of-two head dim")
    w = max_context if window is None else min(window, max_context)
    if capacity < min(w + t - 1, max_context):
        raise ValueError(f"a ring of {capacity} slots cannot hold a window of {w} plus {t} new positions")
    if not causal and window is not None:
        raise ValueError("non-causal decode attention takes no window")
    fp8 = k_scale is not None
    _check_contiguous(cache_k, cache_v, *((k_scale, v_scale) if fp8 else ()))
    cfg = decode_config(d, fp8)
    split = split or decode_split(d, fp8)
    if split % cfg.block_n:
        raise ValueError(f"split {split} is not a multiple of the chunk size {cfg.block_n}")
    splits = decode_num_splits(window, max_context, split)
    one_split = splits == 1  # a short static context: the split kernel writes the output itself
    row_blocks = hkv * triton.cdiv(hq // hkv * t, BLOCK_T)
    combine = not one_split and splits <= COMBINE_IN_SPLIT and row_blocks <= ARRIVAL_COUNTERS
    start = device_start(start, q.device)
    q = q.contiguous()
    out = torch.empty_like(q)
    m = torch.empty((splits, t, hq), dtype=torch.float32, device=q.device)
    l = m if one_split else torch.empty_like(m)  # unused pointers with one split
    acc = m if one_split else torch.empty((splits, t, hq, d), dtype=torch.float32, device=q.device)
    ck, cv = (cache_k.view(torch.uint8), cache_v.view(torch.uint8)) if fp8 else (cache_k, cache_v)
    ks, vs = (k_scale, v_scale) if fp8 else (m, m)  # unused pointers without scales
    _decode_split_kernel[(row_blocks, splits)](
        q,
        ck,
        cv,
        ks,
        vs,
        start,
        m,
        l,
        acc,
        out,
        arrival_counters(q.device),
        t,
        capacity,
        w,
        split,
        splits,
        scale * LOG2E,
        HQ=hq,
        GROUP=hq // hkv,
        D=d,
        BLOCK_T=BLOCK_T,
        BLOCK_N=cfg.block_n,
        FP8=fp8,
        DOT_FP32=interpreted(),
        ONE_SPLIT=one_split,
        COMBINE=combine,
        CAUSAL=causal,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        maxnreg=MAX_REGISTERS,
        **pdl_options(q.device),
    )
    if one_split or combine:
        return faulty("decode_attention", out)
    block_d = min(d, COMBINE_BLOCK_D)
    _decode_combine_kernel[(hq, d // block_d)](
        m,
        l,
        acc,
        start,
        out,
        t,
        w,
        split,
        splits,
        HQ=hq,
        D=d,
        BLOCK_D=block_d,
        BLOCK_T=BLOCK_T,
        num_warps=COMBINE_WARPS,
        num_stages=LAUNCH_STAGES,
        maxnreg=MAX_REGISTERS,
        **pdl_options(out.device),
    )
    return faulty("decode_attention", out)


# ----------------------------------------------------------------------------- prefill


@triton.jit
def _lower_bound(pos_ptr, n, target):
    """First index i in [0, n) with pos[i] >= target (pos increasing); n when there is none. The
    search runs in int64, which the interpreter does not check for overflow at every step."""
    hi = n.to(tl.int64)
    lo = hi * 0
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(pos_ptr + mid) < target
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    return lo.to(tl.int32)


@triton.jit(do_not_specialize=["T", "S"])
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    o_ptr,
    q_pos_ptr,
    k_pos_ptr,
    T,
    S,
    window,
    qk_scale,
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program (query tile, head): online softmax over the keys any of its queries may see. FP8: K
    and V are e4m3 bytes with one fp32 scale per (key, KV head) at ks/vs (a full layer's cache, read
    where it is stored), converted as the decode loop converts them."""
    enter(PDL)
    pid_m, head = tl.program_id(0), tl.program_id(1)
    kv_row = head // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    q_pos = tl.load(q_pos_ptr + rows, mask=row_ok, other=0).to(tl.int32)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (rows * HQ + head)[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    elif FP8:
        q = q.to(tl.float16)
    first = S * 0
    last = S
    if WINDOWED:
        first = _lower_bound(k_pos_ptr, S, tl.min(tl.where(row_ok, q_pos, 1 << 30), 0) - window + 1)
    if CAUSAL:
        last = _lower_bound(k_pos_ptr, S, tl.max(tl.where(row_ok, q_pos, -(1 << 30)), 0) + 1)
    elif WINDOWED:
        last = _lower_bound(k_pos_ptr, S, tl.max(tl.where(row_ok, q_pos, -(1 << 30)), 0) + window)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, D], 0.0, tl.float32)
    for n in range(first, last, BLOCK_N):
        idx = n + tl.arange(0, BLOCK_N)
        k_ok = idx < last
        k_pos = tl.load(k_pos_ptr + idx, mask=k_ok, other=0).to(tl.int32)
        kv_at = idx * (HQ // GROUP) + kv_row
        kv = kv_at[:, None] * D + d[None, :]
        k = tl.load(k_ptr + kv, mask=k_ok[:, None], other=0)
        if FP8:  # as the decode loop
            k = _e4m3_to_f16(k, DOT_FP32)
            k_scale = tl.load(ks_ptr + kv_at, mask=k_ok, other=0.0) * 256.0 * qk_scale
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * k_scale[None, :]
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * qk_scale
        delta = q_pos[:, None] - k_pos[None, :]
        allowed = k_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            allowed = allowed & (delta >= 0)
        if WINDOWED:
            allowed = allowed & (delta < window)
            if not CAUSAL:
                allowed = allowed & (-delta < window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - base)
        p = tl.exp2(s - base[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv, mask=k_ok[:, None], other=0)
        if FP8:
            v = _e4m3_to_f16(v, DOT_FP32)
            p = p * (tl.load(vs_ptr + kv_at, mask=k_ok, other=0.0) * 256.0)[None, :]
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None], input_precision="ieee")
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # a query with no key at all (or a padding row) gives 0
    tl.store(o_ptr + (rows * HQ + head)[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None,
    scale: float,
    causal: bool = True,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """attention_reference's function without its [T, S] scores: q [T, Hq, D], k/v [S, Hkv, D],
    key positions increasing. A query that sees no key gets 0 (the reference gives NaN). With
    k_scale/v_scale [S, Hkv] fp32, k and v are fp8 e4m3 as a cache stores them, read in place."""
    t, hq, d = q.shape
    s, hkv = k.shape[0], k.shape[1]
    if hq % hkv or d & (d - 1):
        raise ValueError("prefill attention needs Hq a multiple of Hkv and a power-of-two head dim")
    fp8 = k_scale is not None
    if fp8:
        _check_contiguous(k, v, k_scale, v_scale)
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # views of a fused projection: one copy
    out = torch.empty_like(q)
    if t == 0:
        return out
    cfg = prefill_config(d)
    ks, vs = (k_scale, v_scale) if fp8 else (q, q)  # unused pointers without scales
    _prefill_kernel[(triton.cdiv(t, cfg.block_m), hq)](
        q,
        k,
        v,
        ks,
        vs,
        out,
        q_pos.to(torch.int64),
        k_pos.to(torch.int64),
        t,
        s,
        window or 0,
        scale * LOG2E,
        HQ=hq,
        GROUP=hq // hkv,
        D=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=causal,
        WINDOWED=window is not None,
        FP8=fp8,
        DOT_FP32=interpreted(),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **({"maxnreg": MAX_REGISTERS} if fp8 else {}),
        **pdl_options(q.device),
    )
    return out


# ----------------------------------------------------------------------------- compile specs

HQ_TARGET = 16
TARGET_LAYERS = ((256, 8, 1024), (512, 2, None))  # (head dim, KV heads, window) of sliding and full layers
DRAFTER = (128, 32, 8)  # head dim, query heads, KV heads
DRAFTER_WINDOW = 2048  # its sliding layers' window (context rings of window + block size)


def _spec(
    name: str,
    fn,
    types: dict[str, str],
    consts: dict,
    num_warps: int,
    num_stages: int = LAUNCH_STAGES,
    maxnreg: int | None = None,
) -> CompileSpec:
    """A spec whose signature lists every argument in the kernel's order, constexprs included
    (but PDL, which kernels.check sets by arch)."""
    types = {**types, **dict.fromkeys(consts, "constexpr")}
    args = [arg for arg in fn.arg_names if arg != "PDL"]
    if set(types) != set(args):
        raise ValueError(f"{name}: signature misnames {sorted(set(types) ^ set(args))}")
    return CompileSpec(
        name, fn, {arg: types[arg] for arg in args}, consts, num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg
    )


def _decode_specs(
    d: int,
    hkv: int,
    window: int | None,
    hq: int = HQ_TARGET,
    causal: bool = True,
    storage: tuple[bool, ...] = (True, False),
) -> list[CompileSpec]:
    kind = ("sliding" if window else "full") + ("" if causal else ",bidirectional")
    specs = []
    for fp8 in storage:
        cfg = decode_config(d, fp8)
        # one split: a context of at most SPLIT positions; a window of few splits always combines in
        # the split kernel, a full layer does up to COMBINE_IN_SPLIT splits of context
        always = window is not None and decode_num_splits(window, 1 << 30, decode_split(d, fp8)) <= COMBINE_IN_SPLIT
        for one_split, combine in [(True, False)] + [(False, c) for c in ((True,) if always else (False, True))]:
            cache = "*u8" if fp8 else "*bf16"
            types = {
                "q_ptr": "*bf16",
                "k_ptr": cache,
                "v_ptr": cache,
                "ks_ptr": "*fp32",
                "vs_ptr": "*fp32",
                "start_ptr": "*i32",
                "m_ptr": "*fp32",
                "l_ptr": "*fp32",
                "acc_ptr": "*fp32",
                "o_ptr": "*bf16",
                "count_ptr": "*i32",
                "qk_scale": "fp32",
                **dict.fromkeys(("T", "capacity", "window", "split", "P"), "i32"),
            }
            consts = {
                "HQ": hq,
                "GROUP": hq // hkv,
                "D": d,
                "BLOCK_T": BLOCK_T,
                "BLOCK_N": cfg.block_n,
                "FP8": fp8,
                "DOT_FP32": False,
                "ONE_SPLIT": one_split,
                "COMBINE": combine,
                "CAUSAL": causal,
            }
            variant = ",one split" if one_split else ",combined" if combine else ""
            name = f"decode_split[D={d},{kind},{'fp8' if fp8 else 'bf16'}{variant}]"
            specs.append(
                _spec(name, _decode_split_kernel, types, consts, cfg.num_warps, cfg.num_stages, maxnreg=MAX_REGISTERS)
            )
    types = {
        "m_ptr": "*fp32",
        "l_ptr": "*fp32",
        "acc_ptr": "*fp32",
        "start_ptr": "*i32",
        "o_ptr": "*bf16",
        **dict.fromkeys(("T", "window", "split", "P"), "i32"),
    }
    consts = {"HQ": hq, "D": d, "BLOCK_D": COMBINE_BLOCK_D, "BLOCK_T": BLOCK_T}
    specs.append(
        _spec(
            f"decode_combine[D={d},HQ={hq}]",
            _decode_combine_kernel,
            types,
            consts,
            COMBINE_WARPS,
            maxnreg=MAX_REGISTERS,
        )
    )
    return specs


def _prefill_spec(d: int, hq: int, hkv: int, causal: bool, windowed: bool, fp8: bool = False) -> CompileSpec:
    cfg = prefill_config(d)
    kv, scales = ("*u8", "*fp32") if fp8 else ("*bf16", "*bf16")
    types = {
        "q_ptr": "*bf16",
        "k_ptr": kv,
        "v_ptr": kv,
        "ks_ptr": scales,
        "vs_ptr": scales,
        "o_ptr": "*bf16",
        "q_pos_ptr": "*i64",
        "k_pos_ptr": "*i64",
        "qk_scale": "fp32",
        **dict.fromkeys(("T", "S", "window"), "i32"),
    }
    consts = {
        "HQ": hq,
        "GROUP": hq // hkv,
        "D": d,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "CAUSAL": causal,
        "WINDOWED": windowed,
        "FP8": fp8,
        "DOT_FP32": False,
    }
    name = (
        f"prefill[D={d},{'causal' if causal else 'bidirectional'},{'window' if windowed else 'full'}"
        f"{',fp8 cache' if fp8 else ''}]"
    )
    return _spec(
        name, _prefill_kernel, types, consts, cfg.num_warps, cfg.num_stages, maxnreg=MAX_REGISTERS if fp8 else None
    )


def compile_specs() -> list[CompileSpec]:
    """Decode/verify (fp8 and bf16 caches) and combine for both layer kinds; prefill for the target
    (causal; sliding and full); the drafter's block (decode over its bf16 context, and prefill; its
    full layers bidirectional, its sliding layers causal)."""
    specs = []
    for d, hkv, window in TARGET_LAYERS:
        specs += _decode_specs(d, hkv, window)
        specs.append(_prefill_spec(d, HQ_TARGET, hkv, causal=True, windowed=window is not None))
        if window is None:  # a full layer's fp8 cache, read in place
            specs.append(_prefill_spec(d, HQ_TARGET, hkv, causal=True, windowed=False, fp8=True))
    d, hq, hkv = DRAFTER  # its block over its context: bf16, causal sliding and bidirectional full layers
    specs += _decode_specs(d, hkv, DRAFTER_WINDOW, hq, causal=True, storage=(False,))
    specs += [
        spec
        for spec in _decode_specs(d, hkv, None, hq, causal=False, storage=(False,))
        if not spec.name.startswith("decode_combine")
    ]  # the same combine as the sliding layers'
    specs += [
        _prefill_spec(d, hq, hkv, causal=False, windowed=False),
        _prefill_spec(d, hq, hkv, causal=True, windowed=True),
    ]
    return specs


def kv_write_specs() -> list[CompileSpec]:
    """The cache write for both layer kinds, fp8 and bf16 storage, bf16 K/V in; and the drafter's
    block, written into its bf16 context past the held length."""
    specs = []
    layers = [(d, hkv, (True, False)) for d, hkv, _ in TARGET_LAYERS] + [(DRAFTER[0], DRAFTER[2], (False,))]
    for d, hkv, storage in layers:
        for fp8 in storage:
            cache, scales = ("*u8", "*fp32") if fp8 else ("*bf16", "*bf16")
            types = {
                "k_ptr": "*bf16",
                "v_ptr": "*bf16",
                "ck_ptr": cache,
                "cv_ptr": cache,
                "ks_ptr": scales,
                "vs_ptr": scales,
                "start_ptr": "*i32",
                **dict.fromkeys(("T", "capacity", "stride_kt", "stride_kh", "stride_vt", "stride_vh"), "i32"),
            }
            specs.append(
                _spec(
                    f"kv_write[D={d},{'fp8' if fp8 else 'bf16'}]",
                    _kv_write_kernel,
                    types,
                    {"HKV": hkv, "D": d, "FP8": fp8, "ROWS": kv_write_rows(d)},
                    KV_WRITE_WARPS,
                )
            )
    return specs
