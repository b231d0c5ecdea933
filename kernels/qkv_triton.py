"""Triton kernel of `qkv.attention_inputs`: a decode step's fused q/k/v projection (int4, one row)
with its head norms, RoPE and K/V store in the same launch.

The projection runs as `linear_triton`'s kernel runs it (the same tiles, split-K and sums: its
output bits are the linear's). A head group is one head (or, for heads narrower than a tile, the
heads of one tile): each tile that finishes its outputs counts itself in on the group's counter,
and the tile that completes a group runs the group's norms, RoPE and K/V store
(`norm_triton.norm_rope_store`) for the row. So the head norms run on as many programs as
there are heads, as soon as each head is ready, with no launch of their own (at batch 1 the launch
cost more than the work). A verify block's 16 rows would run one after another there, so blocks
take the projection and the head-norm kernel apart: that kernel takes the same (row, head) pairs
in the same [ROWS, D] tile over the same 8 warps (norm_triton.head_rows), so a decode row and the
same row in a verify block round alike (batch invariance; the self-test checks it on the card).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import ARRIVAL_COUNTERS, CompileSpec, arrival_counters, interpreted, pdl_options
from flashdesk.kernels.linear_triton import finish_tile, small_tiles, tile_product
from flashdesk.kernels.norm_triton import head_rows, norm_rope_store

if TYPE_CHECKING:  # the front's types; at run time the front calls this module, not the reverse
    from flashdesk.kernels.int4 import Int4Weight
    from flashdesk.kernels.kv_write import KVSlots


@triton.jit(do_not_specialize=["M", "capacity"])
def _qkv_heads_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    qkv_ptr,
    part_ptr,
    count_ptr,
    group_count_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    ck_ptr,
    cv_ptr,
    ks_ptr,
    vs_ptr,
    start_ptr,
    capacity,
    M,
    N,
    eps,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    H: tl.constexpr,
    KVH: tl.constexpr,
    V_MODE: tl.constexpr,
    FP8: tl.constexpr,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """qkv = x @ w.T (int4; grid and split as `_linear_kernel`'s), then per head group: q heads
    rope(norm(q) * q_w) into q [M, H, D]; k heads rope(norm(k) * k_w) and v norm(v) (V_MODE "norm")
    or norm(k) ("k": k_eq_v) into the cache at slot (start + t) % capacity, as kv_write stores them.
    count_ptr: the split tiles' counters; group_count_ptr: the head groups'; both zero between
    launches."""
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
        True,
        HAS_ZERO,
        DOT_FP32,
        "",
        BLOCK_N,
        BLOCK_K,
        PDL,
        True,  # the whole chunk: the kernel before is one program (the norms after the MLPs)
        M,
    )
    if finish_tile(acc, qkv_ptr, part_ptr, count_ptr, pid_n, pid_s, pid_m, offs_m, M, N, SPLIT, BLOCK_M):
        # the tile's outputs are stored: it counts into its head group, and the tile that completes
        # the group runs the group's heads for the tile's row (M * heads a group <= ROWS)
        TILES: tl.constexpr = D // BLOCK_N if D > BLOCK_N else 1  # tiles per group
        PER: tl.constexpr = BLOCK_N // D if BLOCK_N > D else 1  # heads per group
        HEADS: tl.constexpr = H + KVH if V_MODE == "k" else H + 2 * KVH
        GROUPS: tl.constexpr = (HEADS + PER - 1) // PER
        group = pid_n // TILES
        tl.debug_barrier()  # every thread's outputs are stored before the tile counts in
        counter = group_count_ptr + pid_m * GROUPS + group
        if tl.atomic_add(counter, 1, sem="acq_rel") == TILES - 1:  # the group's other tiles are visible
            p = tl.arange(0, ROWS)  # (row, head) pairs as a head-norm program takes them; no loop (pipelined)
            j = group * PER + p % PER
            norm_rope_store(
                pid_m * BLOCK_M + p // PER,
                j,
                (p < (M - pid_m * BLOCK_M) * PER) & (j < HEADS),
                qkv_ptr,
                qkv_ptr + H * D,
                q_w_ptr,
                k_w_ptr,
                cos_ptr,
                sin_ptr,
                q_ptr,
                q_ptr,  # kv: unused, the K/V go into the cache
                ck_ptr,
                cv_ptr,
                ks_ptr,
                vs_ptr,
                start_ptr,
                capacity,
                N,
                N,
                eps,
                H,
                KVH,
                V_MODE,
                False,
                True,
                FP8,
                D,
            )
            tl.atomic_xchg(counter, 0, sem="relaxed")  # the next launch starts from zero


def fusable(rows: int, n: int, k: int, head_dim: int, group_size: int) -> bool:
    """Whether a projection of n outputs over k inputs with `rows` rows runs fused: one row, heads
    of a power-of-two size, its tiles (so its head groups) within the counters, and on a GPU the
    head-norm kernel's warps (the same layout; the interpreter has none, and takes the tiny test
    models' heads here too)."""
    if rows != 1 or head_dim != triton.next_power_of_2(head_dim) or n % head_dim:
        return False
    tiles = small_tiles(n, k, group_size)
    same_layout = interpreted() or head_rows(head_dim, store=True)[1] == tiles.num_warps
    return same_layout and triton.cdiv(n, tiles.block_n) <= ARRIVAL_COUNTERS


def qkv_heads_triton(
    x: torch.Tensor,
    w: Int4Weight,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    k_eq_v: bool,
    into: KVSlots,
) -> torch.Tensor:
    """q [T, H, D] of x [T, K] (T <= 16) through the int4 projection w, with k and v stored into
    `into`; see `_qkv_heads_kernel`."""
    m, k = x.shape
    n = w.shape[0]
    if n != (heads + kv_heads * (1 if k_eq_v else 2)) * head_dim or w.shape[1] != k:
        raise ValueError(f"a q/k/v projection {tuple(w.shape)} does not match x {tuple(x.shape)} and the heads")
    if not fusable(m, n, k, head_dim, w.group_size) or m > into.capacity:
        raise ValueError(f"{m} rows of heads of {head_dim} do not run fused (one row, power-of-two heads)")
    if into.k.shape[1:] != (kv_heads, head_dim) or not (into.k.is_contiguous() and into.v.is_contiguous()):
        raise ValueError(f"cache {tuple(into.k.shape)} does not hold contiguous [slots, {kv_heads}, {head_dim}] heads")
    fp8 = into.k_scale is not None
    cache = (
        (into.k.view(torch.uint8), into.v.view(torch.uint8), into.k_scale, into.v_scale)
        if fp8
        else (into.k, into.v, into.k, into.v)
    )
    tiles = small_tiles(n, k, w.group_size)
    qkv = torch.empty(m, n, device=x.device, dtype=x.dtype)
    q = torch.empty(m, heads, head_dim, device=x.device, dtype=x.dtype)
    part = qkv if tiles.split == 1 else torch.empty(tiles.split, m, n, device=x.device, dtype=torch.float32)
    counters = arrival_counters(x.device)
    packed = w.packed.contiguous()
    _qkv_heads_kernel[(triton.cdiv(n, tiles.block_n), tiles.split, 1)](
        x.contiguous(),
        packed,
        w.scale.contiguous(),
        packed.view(torch.int8) if w.zero is None else w.zero.contiguous(),
        qkv,
        part,
        counters[:ARRIVAL_COUNTERS],
        counters[ARRIVAL_COUNTERS:],
        q_norm,
        k_norm,
        cos.contiguous(),
        sin.contiguous(),
        q,
        *cache,
        into.start,
        into.capacity,
        m,
        n,
        eps,
        K=k,
        K_CHUNK=tiles.k_chunk,
        SPLIT=tiles.split,
        GROUP=w.group_size,
        HAS_ZERO=w.zero is not None,
        DOT_FP32=interpreted(),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        H=heads,
        KVH=kv_heads,
        V_MODE="k" if k_eq_v else "norm",
        FP8=fp8,
        D=head_dim,
        ROWS=head_rows(head_dim, store=True)[0],
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **pdl_options(x.device),
    )
    return q


# the target's layers: (q heads, KV heads, head dim, k_eq_v) of a sliding layer and of a full one
# with v = k or its own v
TARGET_HEADS = [(16, 8, 256, False), (16, 2, 512, True), (16, 2, 512, False)]
HIDDEN = 2816


def compile_specs() -> list[CompileSpec]:
    """Decode and verify blocks of the real model: the three layer shapes, an fp8 or bf16 cache,
    symmetric group-32 int4 (the published export; other groups compile on first use)."""
    specs = []
    for heads, kv_heads, d, k_eq_v in TARGET_HEADS:
        n = (heads + kv_heads * (1 if k_eq_v else 2)) * d
        tiles = small_tiles(n, HIDDEN, 32)
        for fp8 in (True, False):
            signature = {
                "x_ptr": "*bf16",
                "w_ptr": "*i32",
                "scale_ptr": "*bf16",
                "zero_ptr": "*i8",
                "qkv_ptr": "*bf16",
                "part_ptr": "*fp32" if tiles.split > 1 else "*bf16",
                "count_ptr": "*i32",
                "group_count_ptr": "*i32",
                "q_w_ptr": "*fp32",
                "k_w_ptr": "*fp32",
                "cos_ptr": "*bf16",
                "sin_ptr": "*bf16",
                "q_ptr": "*bf16",
                **(
                    {"ck_ptr": "*u8", "cv_ptr": "*u8", "ks_ptr": "*fp32", "vs_ptr": "*fp32"}
                    if fp8
                    else dict.fromkeys(("ck_ptr", "cv_ptr", "ks_ptr", "vs_ptr"), "*bf16")
                ),
                "start_ptr": "*i32",
                "capacity": "i32",
                "M": "i32",
                "N": "i32",
                "eps": "fp32",
            }
            constexprs: dict[str, object] = {
                "K": HIDDEN,
                "K_CHUNK": tiles.k_chunk,
                "SPLIT": tiles.split,
                "GROUP": 32,
                "HAS_ZERO": False,
                "DOT_FP32": False,
                "BLOCK_M": tiles.block_m,
                "BLOCK_N": tiles.block_n,
                "BLOCK_K": tiles.block_k,
                "H": heads,
                "KVH": kv_heads,
                "V_MODE": "k" if k_eq_v else "norm",
                "FP8": fp8,
                "D": d,
                "ROWS": head_rows(d, store=True)[0],
            }
            signature.update(dict.fromkeys(constexprs, "constexpr"))
            name = f"qkv_heads[D={d},H={heads},KVH={kv_heads},v={'k' if k_eq_v else 'norm'},{'fp8' if fp8 else 'bf16'}]"
            specs.append(CompileSpec(name, _qkv_heads_kernel, signature, constexprs, tiles.num_warps, tiles.num_stages))
    return specs


def tail(launch: dict) -> tuple[CompileSpec, int]:
    """What the program that completes the last head group runs after the others, for the
    performance model: the head-norm kernel that stores into the cache (the same code and tile,
    norm_triton.norm_rope_store), once (one row)."""
    from flashdesk.kernels.norm_triton import compile_specs as norm_specs

    c = launch["constexprs"]
    name = (
        f"head_norms[D={c['D']},H={c['H']},KVH={c['KVH']},v={c['V_MODE']},into {'fp8' if c['FP8'] else 'bf16'} cache]"
    )
    spec = next((s for s in norm_specs() if s.name == name), None)
    if spec is None:
        raise ValueError(f"no compiled head-norm kernel {name} to charge a fused q/k/v projection's tail")
    return spec, 1


TAILS = {"_qkv_heads_kernel": tail}  # kernel -> its tail, for engine/bench/step_launches.py
# kernel -> the weights it asks L2 for whole before its wait, for engine/bench/step_launches.py
PREFETCHED = {"_qkv_heads_kernel": ("w_ptr", "scale_ptr", "zero_ptr")}
