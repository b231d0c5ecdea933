"""Triton linear layers: y = x @ W.T with W packed int4 (W4A16) or dense bf16/fp32.

One kernel serves every case. A program owns a [BLOCK_M, BLOCK_N] output tile and walks one
chunk of K in BLOCK_K steps; each step loads the weight tile with wide loads along K (a packed
row's K/8 int32 words are contiguous; the pipeliner turns them into 16-byte async copies),
dequantizes it in registers and feeds `tl.dot` with fp32 accumulation.

- 1..16 rows (decode, verify; bandwidth-bound): BLOCK_M is always 16 with masked rows, and the
  tiles and the K split come from the weight's shape alone, so row r gets the same bits in an
  m-row call as alone (batch invariance: a tensor-core row never mixes with other rows). Where
  the N tiles alone would not fill the GPU, K is cut into SPLIT chunks: each writes its fp32
  partial [SPLIT, M, N] and counts itself in on a per-tile counter; the chunk that arrives last
  adds the partials in chunk order (whichever chunk that is, the sum is the same) and resets the
  counter. One launch per linear instead of two (at batch 1 a launch costs more than the adds),
  no host sync, grids from shapes only: a captured launch replays.
- more rows (prefill, compute-bound): 128x128 tiles over the whole K; the dense case is torch.
- a GLU MLP's first projection ([gate; up] weight) can return act(gate) * up: each tile holds
  matching gate and up rows, so the activation runs once per output in the epilogue and the
  down projection that follows is a plain linear.

The tensor-core operands are x's dtype; under the interpreter (whose bf16 dot is broken) fp32.
A dequantized bf16 weight equals the torch reference's bf16 dequantization bit for bit, since
(q - zero) * scale is computed exactly in fp32 and rounded once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from flashdesk.kernels.backend import (
    ARRIVAL_COUNTERS,
    MAX_REGISTERS,
    CompileSpec,
    arrival_counters,
    interpreted,
    pdl_options,
)
from flashdesk.kernels.grid_dependency import enter, prefetch_rows
from flashdesk.kernels.int4 import Int4Weight
from flashdesk.kernels.glu import gate

SMALL_M = 16  # rows per tile of the batch-invariant path; calls with more rows take the prefill path
TARGET_PROGRAMS = 512  # ~4 resident tiles per SM on 82..170-SM cards: enough loads in flight
MAX_SPLIT_TILES = ARRIVAL_COUNTERS  # output tiles of a split launch: fewer than TARGET_PROGRAMS, or it would not split


@triton.jit
def _groups(
    scale_rows, zero_rows, k0, K: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, BLOCK_K: tl.constexpr
):
    """Scales and zeros (as stored) of the tile at column k0, from pointers to each row's first
    group: [BLOCK_N, 1] when the tile lies in one group, else [BLOCK_N, groups in the tile] or,
    for a group size that is not a power of two, [BLOCK_N, BLOCK_K // 8] (one per word; GROUP is
    a multiple of 8). Indices past K are clamped (k0 may be one step past the end), so no load
    needs a mask. Symmetric weights get the scales again as an unread stand-in for the zeros."""
    if GROUP % BLOCK_K == 0 or GROUP == K:
        g = tl.minimum(k0, K - 1) // GROUP
    elif BLOCK_K % GROUP == 0 and (GROUP & (GROUP - 1)) == 0:
        g = tl.minimum(k0 // GROUP + tl.arange(0, BLOCK_K // GROUP), K // GROUP - 1)[None, :]
    else:
        g = (tl.minimum(k0 // 8 + tl.arange(0, BLOCK_K // 8), K // 8 - 1) // (GROUP // 8))[None, :]
    scale = tl.load(scale_rows + g)
    if HAS_ZERO:
        zero = tl.load(zero_rows + g)
    else:
        zero = scale
    return scale, zero


@triton.jit
def _per_word(t, WORDS: tl.constexpr):
    """A [BLOCK_N, groups] tile of `_groups` with each group's value repeated over its words."""
    return tl.reshape(
        tl.broadcast_to(t[:, :, None], (t.shape[0], t.shape[1], WORDS // t.shape[1])), (t.shape[0], WORDS)
    )


@triton.jit
def _int4_tile(w_rows, k0, scale, zero, one, K: tl.constexpr, HAS_ZERO: tl.constexpr, BLOCK_K: tl.constexpr):
    """The dequantized fp32 weight tile [BLOCK_N, BLOCK_K] at column k0 (finite past K).

    Nibble j of a word is shifted to bits 19..22, under the bits of 1.0 (`one`): read as fp32 it
    is f = 1 + nibble/16, with no int-to-float conversion; then f * 16 scale - (24 + zero) scale
    = (nibble - 8 - zero) scale, both products exact for a bf16/fp16 scale, so one fma rounds
    nothing. Nested joins keep a word's 8 values in one thread; the (a, b, c) index of the
    joined tensor is nibble 4a + 2b + c, so the reshape lays them out along K in order."""
    offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    if K % BLOCK_K == 0:
        words = tl.load(w_rows + offs_w[None, :])
    else:
        words = tl.load(w_rows + offs_w[None, :], mask=(offs_w < K // 8)[None, :], other=0)
    bits = tl.join(
        tl.join(tl.join(words << 19, words << 3), tl.join(words << 11, words >> 5)),
        tl.join(tl.join(words << 15, words >> 1), tl.join(words << 7, words >> 9)),
    )
    f = ((bits & 0x780000) | one).to(tl.float32, bitcast=True)
    if scale.shape[1] != 1 and scale.shape[1] != BLOCK_K // 8:  # whole groups: one value per word
        scale, zero = _per_word(scale, BLOCK_K // 8), _per_word(zero, BLOCK_K // 8)
    scale = scale.to(tl.float32)
    if HAS_ZERO:
        neg_bias = -(zero.to(tl.float32) + 24.0) * scale
    else:
        neg_bias = scale * -24.0
    w = tl.fma(f, (scale * 16.0)[:, :, None, None, None], neg_bias[:, :, None, None, None])
    return tl.reshape(w, (w_rows.shape[0], BLOCK_K))


@triton.jit
def gelu_tanh(g):
    """0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) of fp32 g, tanh from exp(-2|u|): never overflows."""
    u = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    return 0.5 * g * (1.0 + tl.where(u < 0, -t, t))


@triton.jit
def gated_product(gate, up, ACTIVATION: tl.constexpr):
    """act(gate) * up, each rounded to the activations' dtype as the torch ops round."""
    g = gate.to(tl.float32)
    if ACTIVATION == "gelu_tanh":
        a = gelu_tanh(g)
    else:  # silu
        a = g / (1.0 + tl.exp(-g))
    return (a.to(gate.dtype).to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def softcapped(acc, ty: tl.constexpr, CAP: tl.constexpr):
    """CAP * tanh(y / CAP) in fp32 of the output y = acc rounded to the activations' dtype (as the
    torch path rounds the head's output before its .float()); tanh from exp(-2|u|), as gelu_tanh."""
    u = tl.div_rn(acc.to(ty).to(tl.float32), CAP)  # rounded as torch's division, not div.full
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(u < 0, -t, t) * CAP


@triton.jit
def _tile_rows(pid_n, c, N, ACTIVATION: tl.constexpr, BLOCK_N: tl.constexpr):
    """The weight rows of tile pid_n's columns c, and which exist: rows pid_n * BLOCK_N + c; with
    an ACTIVATION (a [gate; up] weight of 2N rows) gate rows for the first BLOCK_N / 2 columns
    and the matching up rows for the others. Rows past the end are clamped to the last (N - 1, or
    its up row), so they can be loaded without a mask and are never stored."""
    if ACTIVATION == "":
        row = pid_n * BLOCK_N + c
        return tl.minimum(row, N - 1), row < N
    gate = pid_n * (BLOCK_N // 2) + c % (BLOCK_N // 2)
    return tl.minimum(gate, N - 1) + (c // (BLOCK_N // 2)) * N, gate < N


@triton.jit
def _glu(tile, ty: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """act(gate) * up of an fp32 tile [BLOCK_M, BLOCK_N] whose first BLOCK_N / 2 columns are gate
    outputs and the rest the matching up outputs: [BLOCK_M, BLOCK_N / 2] in ty, gate and up each
    rounded to ty first, as a torch linear rounds its output."""
    gate, up = tl.split(tl.permute(tl.reshape(tile, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    return gated_product(gate.to(ty), up.to(ty), ACTIVATION)


@triton.jit
def tile_product(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    pid_n,
    pid_s,
    offs_m,
    N,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    GROUP: tl.constexpr,
    INT4: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr,
    M,
):
    """The fp32 tile [BLOCK_M, BLOCK_N] of x [M, K] @ w.T over chunk pid_s of K (rows offs_m,
    weight rows of tile pid_n): prefetches the chunk's first weights (WHOLE_CHUNK: all of them,
    with their scales: what a kernel that follows a one-program chain may fetch while it runs),
    waits for the kernels before (`enter`), then walks the chunk. Weight loads have no row mask:
    rows past N read row N - 1 and are never stored (fewer live predicates; ptxas 13 spilled one
    across the loop). x is masked, so columns past K add 0."""
    c = tl.arange(0, BLOCK_N)
    rows, _ = _tile_rows(pid_n, c, N, ACTIVATION, BLOCK_N)
    m_mask = offs_m < M
    x_rows = x_ptr + offs_m[:, None] * K
    k_start = pid_s * K_CHUNK
    # columns prefetched: two steps, or the whole chunk
    AHEAD: tl.constexpr = K_CHUNK if WHOLE_CHUNK or K_CHUNK < 2 * BLOCK_K else 2 * BLOCK_K
    GROUPS: tl.constexpr = K_CHUNK // GROUP if WHOLE_CHUNK and K_CHUNK > GROUP else 1  # scale groups prefetched
    if INT4:
        w_rows = w_ptr + rows[:, None] * (K // 8)
        scale_rows = scale_ptr + (rows * (K // GROUP))[:, None]
        zero_rows = zero_ptr + (rows * (K // GROUP))[:, None]
        prefetch_rows(w_rows, k_start // 2, AHEAD // 2, K // 2, PDL)
        s_bytes: tl.constexpr = scale_ptr.dtype.element_ty.primitive_bitwidth // 8
        prefetch_rows(scale_rows, k_start // GROUP * s_bytes, GROUPS * s_bytes, K // GROUP * s_bytes, PDL)
        if HAS_ZERO:
            z_bytes: tl.constexpr = zero_ptr.dtype.element_ty.primitive_bitwidth // 8
            prefetch_rows(zero_rows, k_start // GROUP * z_bytes, GROUPS * z_bytes, K // GROUP * z_bytes, PDL)
    else:
        w_rows = w_ptr + rows[:, None] * K
        w_bytes: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
        prefetch_rows(w_rows, k_start * w_bytes, AHEAD * w_bytes, K * w_bytes, PDL)
    enter(PDL)  # weights are never written by the step: prefetched before the wait, x after it
    dot_ty = tl.float32 if DOT_FP32 else x_ptr.dtype.element_ty
    acc = tl.zeros((offs_m.shape[0], BLOCK_N), tl.float32)
    # the bits of 1.0, from a value the compiler cannot see (N >= 0), so that it stays in a
    # register and `(bits & mask) | one` compiles to one LOP3 instead of two
    one = 0x3F800000 | (N >> 31)
    if INT4:  # scales and zeros are fetched one step ahead: their small loads cannot go async
        scale, zero = _groups(scale_rows, zero_rows, k_start, K, GROUP, HAS_ZERO, BLOCK_K)
    for k0 in range(k_start, tl.minimum(k_start + K_CHUNK, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if K % BLOCK_K == 0:  # no step runs past K: no column masks
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None], other=0.0)
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
        if INT4:
            cur_scale, cur_zero = scale, zero
            if GROUP != K:
                scale, zero = _groups(scale_rows, zero_rows, k0 + BLOCK_K, K, GROUP, HAS_ZERO, BLOCK_K)
            w = _int4_tile(w_rows, k0, cur_scale, cur_zero, one, K, HAS_ZERO, BLOCK_K)
        elif K % BLOCK_K == 0:
            w = tl.load(w_rows + offs_k[None, :])
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
        acc = tl.dot(x.to(dot_ty), tl.trans(w.to(dot_ty)), acc, input_precision="ieee")
    return acc


@triton.jit
def store_partial(acc, part_ptr, pid_n, pid_s, offs_m, M, N, ACTIVATION: tl.constexpr, BLOCK_N: tl.constexpr):
    """A K chunk's fp32 partial tile into part [SPLIT, M, weight rows] (one value per weight row)."""
    W_ROWS = N if ACTIVATION == "" else 2 * N
    w_row, w_row_ok = _tile_rows(pid_n, tl.arange(0, BLOCK_N), N, ACTIVATION, BLOCK_N)
    tl.store(
        part_ptr + pid_s * M * W_ROWS + offs_m[:, None] * W_ROWS + w_row[None, :],
        acc,
        mask=(offs_m < M)[:, None] & w_row_ok[None, :],
    )


@triton.jit
def sum_partials(
    part_ptr,
    pid_n,
    pid_m,
    M,
    N,
    SPLIT: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The last chunk to arrive: the tile's partials added in chunk order (the same bits whichever
    chunk came last), as one vector [BLOCK_M * BLOCK_N] (few registers for the sum), with its
    offsets in [M, N] (weight rows, for an ACTIVATION's [gate; up]) and its mask."""
    W_ROWS = N if ACTIVATION == "" else 2 * N
    flat = tl.arange(0, BLOCK_M * BLOCK_N)
    row = pid_m * BLOCK_M + flat // BLOCK_N
    col, col_ok = _tile_rows(pid_n, flat % BLOCK_N, N, ACTIVATION, BLOCK_N)
    flat_at, flat_mask = row * W_ROWS + col, (row < M) & col_ok
    total = tl.load(part_ptr + flat_at, mask=flat_mask, other=0.0, cache_modifier=".cg")
    for s in range(1, SPLIT):
        total += tl.load(part_ptr + s * M * W_ROWS + flat_at, mask=flat_mask, other=0.0, cache_modifier=".cg")
    return total, flat_at, flat_mask


@triton.jit
def finish_tile(
    acc, out_ptr, part_ptr, count_ptr, pid_n, pid_s, pid_m, offs_m, M, N, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Store a plain (no activation) tile's outputs: the tile itself, or with SPLIT > 1 its chunk's
    partial, and the last chunk to arrive the sum (as `_linear_kernel` does). Returns whether this
    program stored the tile's final outputs (always, without a split): a fused kernel's epilogue
    may then read them."""
    BLOCK_N: tl.constexpr = acc.shape[1]
    if SPLIT == 1:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        out_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        done = True
    else:
        store_partial(acc, part_ptr, pid_n, pid_s, offs_m, M, N, "", BLOCK_N)
        tl.debug_barrier()  # all of this program's partial is written before the release below
        counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
        done = tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT - 1  # the others' partials are visible
        if done:
            total, flat_at, flat_mask = sum_partials(part_ptr, pid_n, pid_m, M, N, SPLIT, "", BLOCK_M, BLOCK_N)
            tl.store(out_ptr + flat_at, total.to(out_ptr.dtype.element_ty), mask=flat_mask)
            tl.atomic_xchg(counter, 0, sem="relaxed")  # the next launch starts from zero
    return done


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count: M = 1 is not special
def _linear_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
    INT4: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SOFTCAP: tl.constexpr = 0.0,
    PDL: tl.constexpr = False,
):
    """out[m, n] = sum over k of x[m, k] * w[n, k]; grid (N tiles, SPLIT chunks of K, M tiles).
    With SPLIT > 1 each chunk writes part[s, m, weight row]; the last to finish sums them
    (count_ptr: one int32 per output tile, zero between launches).

    With an ACTIVATION the weight is [gate; up] (2N rows) and out[m, n] = act(gate) * up of row n of
    each half (a GLU MLP's first projection with its activation): a tile's first BLOCK_N / 2 columns
    are gate rows, the others the matching up rows, so one tile holds both operands of its outputs
    and the activation runs once per output, in the epilogue. With a SOFTCAP the output is fp32
    logits SOFTCAP * tanh(out / SOFTCAP) (Gemma's final softcap, in the head's epilogue)."""
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tile_product(
        x_ptr,
        w_ptr,
        scale_ptr,
        zero_ptr,
        pid_n,
        pid_s,
        offs_m,
        N,
        K,
        K_CHUNK,
        GROUP,
        INT4,
        HAS_ZERO,
        DOT_FP32,
        ACTIVATION,
        BLOCK_N,
        BLOCK_K,
        PDL,
        False,
        M,
    )
    ty: tl.constexpr = out_ptr.dtype.element_ty
    OUT_N: tl.constexpr = BLOCK_N if ACTIVATION == "" else BLOCK_N // 2
    offs_out = pid_n * OUT_N + tl.arange(0, OUT_N)
    out_at = offs_m[:, None] * N + offs_out[None, :]
    out_mask = (offs_m < M)[:, None] & (offs_out < N)[None, :]
    x_ty: tl.constexpr = x_ptr.dtype.element_ty
    if SPLIT == 1:
        if SOFTCAP != 0.0:  # a float constexpr: compared, not tested for truth
            tl.store(out_ptr + out_at, softcapped(acc, x_ty, SOFTCAP), mask=out_mask)
        elif ACTIVATION == "":
            tl.store(out_ptr + out_at, acc.to(ty), mask=out_mask)
        else:
            tl.store(out_ptr + out_at, _glu(acc, ty, ACTIVATION, BLOCK_M, BLOCK_N), mask=out_mask)
    else:
        store_partial(acc, part_ptr, pid_n, pid_s, offs_m, M, N, ACTIVATION, BLOCK_N)
        tl.debug_barrier()  # all of this program's partial is written before the release below
        counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT - 1:  # the others' partials are visible
            total, flat_at, flat_mask = sum_partials(part_ptr, pid_n, pid_m, M, N, SPLIT, ACTIVATION, BLOCK_M, BLOCK_N)
            if SOFTCAP != 0.0:
                tl.store(out_ptr + flat_at, softcapped(total, x_ty, SOFTCAP), mask=flat_mask)
            elif ACTIVATION == "":
                tl.store(out_ptr + flat_at, total.to(ty), mask=flat_mask)
            else:
                glu = _glu(tl.reshape(total, (BLOCK_M, BLOCK_N)), ty, ACTIVATION, BLOCK_M, BLOCK_N)
                tl.store(out_ptr + out_at, glu, mask=out_mask)
            tl.atomic_xchg(counter, 0, sem="relaxed")  # the next launch starts from zero


class Tiles(NamedTuple):
    """One launch configuration; every field is a function of the weight's (N, K, group) only."""

    block_m: int
    block_n: int
    block_k: int
    split: int  # K chunks (1: no split)
    k_chunk: int  # columns per chunk, a multiple of block_k
    num_warps: int
    num_stages: int
    maxnreg: int | None = None  # the register ceiling, where the launch passes one


def small_tiles(n: int, k: int, group: int | None) -> Tiles:
    """The 1..16-row configuration for a weight of n rows; `group` None for a dense weight.

    Chunks of >= 2 K steps are added until about TARGET_PROGRAMS tiles are in flight: a narrow N
    (router, o_proj, down) would otherwise leave most SMs idle while one reads the whole K.
    int4 runs 8 warps and 3 stages: two K steps of weights in flight per block, 34 KiB per SM on
    an H200 (which needs ~25 KiB per SM to stream at speed; 2 stages kept 17). With 4 warps ptxas
    spills a register or two around the loop on sm_90. A K under 256 (the test models) takes
    64-column steps, fewer of them: Triton's interpreter, which runs the tests, pays per step.
    A GLU projection's tiles hold 64 weight rows as any other's (32 gate, 32 up)."""
    block_n, block_k = 64, 128
    if k < 256:  # only the test models: 64-column steps (in fp32, 64 x 128 tiles spilled or passed 99 KB)
        block_k = min(triton.next_power_of_2(k), 64)
    k_steps = triton.cdiv(k, block_k)
    wanted = triton.cdiv(TARGET_PROGRAMS, triton.cdiv(n, block_n))
    steps_per_chunk = max(2, triton.cdiv(k_steps, wanted))
    split = triton.cdiv(k_steps, steps_per_chunk)
    num_warps, num_stages = (4, 3) if group is None else (8, 3)
    return Tiles(SMALL_M, block_n, block_k, split, steps_per_chunk * block_k, num_warps, num_stages)


def prefill_tiles(n: int, k: int, group: int | None) -> Tiles:
    """The >16-row int4 configuration: 128x128 output tiles over the whole K, 32 columns a step
    (one group-32 scale per row and step; the dequantization is shared by 128 rows). Never a GLU:
    its activation runs on its own after (compute-bound, it costs little there). The ceiling is
    the card's: with a per-channel scale (loaded once, live across the loop) and N known divisible
    by 16, ptxas held the tile to 128 registers on sm_86/89 and spilled 8 bytes; the others take
    ~144 either way."""
    return Tiles(128, 128, 32, 1, triton.cdiv(k, 32) * 32, 8, 3, MAX_REGISTERS)


ACTIVATIONS = ("gelu_tanh", "silu")


def _check(x: torch.Tensor, n: int, k: int, activation: str) -> None:
    if activation and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}: the choice is {', '.join(ACTIVATIONS)}")
    if activation and n % 2:
        raise ValueError(f"a GLU weight stacks [gate; up]: its {n} rows are not an even number")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} does not match a weight with {k} inputs")


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    n: int,
    group: int,
    int4: bool,
    has_zero: bool,
    tiles: Tiles,
    activation: str,
    softcap: float = 0.0,
) -> torch.Tensor:
    """One launch over an [n, k] weight; with an `activation` its output is act(gate) * up, n / 2
    wide; with a `softcap` fp32 capped logits."""
    m, k = x.shape
    n_out, out_tile = (n // 2, tiles.block_n // 2) if activation else (n, tiles.block_n)
    out = torch.empty(m, n_out, device=x.device, dtype=torch.float32 if softcap else x.dtype)
    if m == 0:
        return out
    grid = (triton.cdiv(n_out, out_tile), tiles.split, triton.cdiv(m, tiles.block_m))
    part = out if tiles.split == 1 else torch.empty(tiles.split, m, n, device=x.device, dtype=torch.float32)
    if tiles.split > 1 and grid[0] * grid[2] > MAX_SPLIT_TILES:
        raise ValueError(
            f"a split launch of {grid[0] * grid[2]} output tiles: more than the {MAX_SPLIT_TILES} counters"
        )
    _linear_kernel[grid](
        x,
        w,
        scale,
        zero,
        out,
        part,
        arrival_counters(x.device),
        m,
        n_out,
        K=k,
        K_CHUNK=tiles.k_chunk,
        SPLIT=tiles.split,
        GROUP=group,
        INT4=int4,
        HAS_ZERO=has_zero,
        DOT_FP32=interpreted(),
        ACTIVATION=activation,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        SOFTCAP=float(softcap),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **({"maxnreg": tiles.maxnreg} if tiles.maxnreg else {}),
        **pdl_options(x.device),
    )
    return out


def w4a16_linear(x: torch.Tensor, w: Int4Weight, activation: str = "") -> torch.Tensor:
    """x [M, K] @ w.dequantize().T -> [M, N] in x's dtype, fp32 accumulation; with an
    `activation` w is [gate; up] and the output act(x @ gate.T) * (x @ up.T), [M, N / 2].

    Rows 1..16 are batch invariant (row r is bit-identical to the same row computed alone)."""
    n, k = w.shape
    _check(x, n, k, activation)
    packed = w.packed.contiguous()
    zero = packed.view(torch.int8) if w.zero is None else w.zero.contiguous()  # an unread int8 stand-in
    small = x.shape[0] <= SMALL_M
    tiles = small_tiles(n, k, w.group_size) if small else prefill_tiles(n, k, w.group_size)
    out = _launch(
        x.contiguous(),
        packed,
        w.scale.contiguous(),
        zero,
        n,
        w.group_size,
        True,
        w.zero is not None,
        tiles,
        activation if small else "",
    )
    return out if small or not activation else gate(out, activation)


def dense_linear(x: torch.Tensor, w: torch.Tensor, activation: str = "", softcap: float = 0.0) -> torch.Tensor:
    """x [M, K] @ w.T for a dense [N, K] weight (`activation` as in w4a16_linear): the
    batch-invariant kernel for 1..16 rows, torch beyond. With a `softcap` (1..16 rows, no
    activation) fp32 logits softcap * tanh(out / softcap), capped in the epilogue."""
    n, k = w.shape
    _check(x, n, k, activation)
    if softcap and (activation or x.shape[0] > SMALL_M):
        raise ValueError("the softcap runs in the epilogue of a plain projection of 1..16 rows")
    if x.shape[0] > SMALL_M:
        out = F.linear(x, w)
        return gate(out, activation) if activation else out
    w = w.contiguous()
    return _launch(x.contiguous(), w, w, w, n, 0, False, False, small_tiles(n, k, None), activation, softcap)


# --- compile specs: the real model's shapes -------------------------------------------------------

HIDDEN = 2816
# (N, K) of the target's int4 linears: qkv sliding / full (k == v, and k != v), o_proj sliding /
# full, dense MLP gate_up / down; any group size of 32, 128 or channel-wise (None), either symmetry.
TARGET_INT4 = [
    (8192, HIDDEN),
    (8704, HIDDEN),
    (9216, HIDDEN),
    (HIDDEN, 4096),
    (HIDDEN, 8192),
    (4224, HIDDEN),
    (HIDDEN, 2112),
]
TARGET_GROUPS = (32, 128, None)
# The drafter's linears (fc over the 6 tapped target layers, qkv; kv alone, for its context; o, gate_up, down): bf16, or
# symmetric group-32 int4 when it is quantized on load, with an int4 head (whole, or in the
# 32768-row chunks of its torch path).
DRAFTER = [(HIDDEN, 6 * HIDDEN), (6144, HIDDEN), (2048, HIDDEN), (HIDDEN, 4096), (11264, HIDDEN), (HIDDEN, 5632)]
DRAFTER_INT4 = DRAFTER + [(262144, HIDDEN), (32768, HIDDEN)]
# Gemma 4's MTP assistant (bf16, width 1024): pre_projection over [embedding, hidden], q of a
# sliding / full layer, o of each, the MLP's gate_up (GLU) and down, post_projection, its tied head.
ASSISTANT_WIDTH = 1024
ASSISTANT = [
    (ASSISTANT_WIDTH, 2 * HIDDEN),
    (4096, ASSISTANT_WIDTH),
    (8192, ASSISTANT_WIDTH),
    (ASSISTANT_WIDTH, 4096),
    (ASSISTANT_WIDTH, 8192),
    (16384, ASSISTANT_WIDTH),
    (HIDDEN, ASSISTANT_WIDTH),
    (262144, ASSISTANT_WIDTH),
]
# Dense: the tied head, the router, the bf16 drafter, the assistant, and target layers a checkpoint
# leaves unquantized.
DENSE = [(262144, HIDDEN), (128, HIDDEN)] + DRAFTER + ASSISTANT + TARGET_INT4
HEAD, HEAD_SOFTCAP = (262144, HIDDEN), 30.0  # the tied head of decode and verify steps, Gemma 4's final softcap


# The GLU MLPs' [gate; up] projections apply their activation in the epilogue.
ACTIVATION_OF = {(4224, HIDDEN): "gelu_tanh", (11264, HIDDEN): "silu", (16384, ASSISTANT_WIDTH): "gelu_tanh"}


def _kernel_spec(
    n: int, k: int, group: int, int4: bool, has_zero: bool, tiles: Tiles, kind: str, softcap: float = 0.0
) -> CompileSpec:
    signature = {
        "x_ptr": "*bf16",
        "w_ptr": "*i32" if int4 else "*bf16",
        "scale_ptr": "*bf16",
        "zero_ptr": "*i8" if int4 else "*bf16",
        "out_ptr": "*bf16",
        "part_ptr": "*bf16" if tiles.split == 1 else "*fp32",
        "count_ptr": "*i32",
        "M": "i32",
        "N": "i32",
    }
    constexprs = {
        "K": k,
        "K_CHUNK": tiles.k_chunk,
        "SPLIT": tiles.split,
        "GROUP": group,
        "INT4": int4,
        "HAS_ZERO": has_zero,
        "DOT_FP32": False,
        "ACTIVATION": ACTIVATION_OF.get((n, k), "") if kind == "small" else "",
        "BLOCK_M": tiles.block_m,
        "BLOCK_N": tiles.block_n,
        "BLOCK_K": tiles.block_k,
        "SOFTCAP": softcap,
    }
    if softcap:  # fp32 logits (without a split, the partials' pointer is the output's too)
        signature["out_ptr"] = "*fp32"
        signature["part_ptr"] = "*fp32"
    signature.update({name: "constexpr" for name in constexprs})
    gated = f"_{constexprs['ACTIVATION']}" if constexprs["ACTIVATION"] else ""
    capped = f"_softcap{softcap:g}" if softcap else ""
    name = f"linear_{kind}_{'w4' if int4 else 'bf16'}_n{n}_k{k}_g{group}{'_zero' if has_zero else ''}{gated}{capped}"
    return CompileSpec(
        name, _linear_kernel, signature, constexprs, tiles.num_warps, tiles.num_stages, maxnreg=tiles.maxnreg
    )


def compile_specs() -> list[CompileSpec]:
    """Every specialization launched for the real shapes, bf16 activations, each listed once."""
    specs: dict[tuple, CompileSpec] = {}

    def add(spec: CompileSpec) -> None:
        key = (tuple(sorted(spec.signature.items())), tuple(sorted(spec.constexprs.items())), spec.fn)
        specs.setdefault(key, spec)

    int4 = [
        (n, k, g or k, zero)
        for n, k in TARGET_INT4
        for g in TARGET_GROUPS
        for zero in (False, True)
        if k % (g or k) == 0
    ] + [(n, k, 32, False) for n, k in DRAFTER_INT4]
    for n, k, group, has_zero in int4:
        add(_kernel_spec(n, k, group, True, has_zero, small_tiles(n, k, group), "small"))
        add(_kernel_spec(n, k, group, True, has_zero, prefill_tiles(n, k, group), "prefill"))
    for n, k in DENSE:
        add(_kernel_spec(n, k, 0, False, False, small_tiles(n, k, None), "small"))
    add(_kernel_spec(*HEAD, 0, False, False, small_tiles(*HEAD, None), "small", HEAD_SOFTCAP))
    return list(specs.values())
