"""Triton RMSNorm: each row reduced whole in one block of a fixed shape, so every row is reduced
the same way whatever the number of rows (batch invariant). Narrow rows (head norms of small
models) go several to a program; how many depends on the row width only.

Gemma 4's q/k/v head norms (q and k with their rotate-half RoPE, v without a weight) run as one
kernel reading the heads straight from the fused qkv projection, rounding where the unfused torch
ops round (norm, the two RoPE products, their sum). The plain norm also fuses a residual add and a
scale, for the unfused forms of `layer_norms`' chains.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.attention_triton import store_quantized
from flashdesk.kernels.backend import LAUNCH_STAGES, MAX_REGISTERS, CompileSpec, pdl_options
from flashdesk.kernels.grid_dependency import enter, prefetch_vector
from flashdesk.kernels.kv_write import KVSlots

TILE = 4096  # elements per program: one 2816-wide hidden row (padded), or several narrow rows


def row_shape(d: int) -> tuple[int, int, int]:
    """(rows per program, block, warps) for rows of width d, each whole in one block: from the width
    alone, so every row is reduced the same way whatever the number of rows."""
    block = triton.next_power_of_2(d)
    return max(1, TILE // block), block, 8 if block >= 2048 else 4


@triton.jit
def row_tile(R, D, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's rows [ROWS, BLOCK] of a [R, D] tensor: row and column indices, offsets and
    the in-bounds mask."""
    cols = tl.arange(0, BLOCK)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    return rows, cols, rows[:, None] * D + cols[None, :], (rows < R)[:, None] & (cols < D)[None, :]


@triton.jit(do_not_specialize=["R"])
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    res_ptr,
    scale_ptr,
    out_ptr,
    R,
    D,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out = norm(x) * w [+ residual] [* scale], rounded to the output type after each step."""
    _, cols, at, mask = row_tile(R, D, ROWS, BLOCK)
    if HAS_WEIGHT:  # x is the kernel before's output, in L2
        prefetch_vector(w_ptr, D, BLOCK, PDL)
    enter(PDL)
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    y = x * inv[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    out_ty = out_ptr.dtype.element_ty
    if HAS_RESIDUAL:
        y = y.to(out_ty).to(tl.float32) + tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        y = y.to(out_ty).to(tl.float32) * tl.load(scale_ptr).to(tl.float32)
    tl.store(out_ptr + at, y.to(out_ty), mask=mask)


@triton.jit(do_not_specialize=["R"])
def _embed_norm_kernel(
    ids_ptr,
    table_ptr,
    w_ptr,
    h_ptr,
    x_ptr,
    scale,
    R,
    D,
    eps,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """h = table[ids] * scale, rounded to the table's dtype (a step's first residual row), and
    x = norm(h) * w (the first layer's input), as `_rms_norm_kernel` computes it."""
    rows, cols, at, ok = row_tile(R, D, ROWS, BLOCK)
    prefetch_vector(w_ptr, D, BLOCK, PDL)
    enter(PDL)
    ty: tl.constexpr = h_ptr.dtype.element_ty
    token = tl.load(ids_ptr + rows, mask=rows < R, other=0).to(tl.int64)
    e = tl.load(table_ptr + token[:, None] * D + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    h = (e * scale).to(ty)
    tl.store(h_ptr + at, h, mask=ok)
    x = h.to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps))[:, None]
    y = y * tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    tl.store(x_ptr + at, y.to(ty), mask=ok)


@triton.jit(do_not_specialize=["R", "capacity"])
def _head_norms_kernel(
    q_src_ptr,
    kv_src_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    kv_ptr,
    ck_ptr,
    cv_ptr,
    ks_ptr,
    vs_ptr,
    start_ptr,
    capacity,
    R,
    q_stride,
    kv_stride,
    eps,
    H: tl.constexpr,
    KVH: tl.constexpr,
    V_MODE: tl.constexpr,
    WEIGHT_AFTER_CAST: tl.constexpr,
    STORE: tl.constexpr,
    FP8: tl.constexpr,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Rows are (token, head) pairs: q heads j < H at q_src[t * q_stride + j * D], then the k heads
    and (V_MODE "norm" or "copy") the v heads at kv_src[t * kv_stride + (j - H) * D]. q heads:
    rope(norm(x) * q_w) into q [T, H, D]; k heads: rope(norm(x) * k_w) into kv; v: norm(x) of the v
    heads ("norm"), the v heads as they are ("copy": the drafter's), norm(x) of the k heads ("k":
    Gemma's k_eq_v), or not written ("none": kv holds k only, [T, KVH, D]; else [T, 2 KVH, D], v
    after k). RoPE: y * cos + rotate_half(y) * sin, cos/sin [T, D]. WEIGHT_AFTER_CAST rounds norm(x)
    before the weight (Qwen3's norm, the drafter's).
    STORE: k and v go straight into a layer's cache [capacity, KVH, D] at slot (start + t) %
    capacity instead of kv (quantized to fp8 with per-row scales when FP8), as kv_write stores them."""
    HEADS: tl.constexpr = H + KVH if V_MODE == "k" or V_MODE == "none" else H + 2 * KVH
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    prefetch_vector(q_w_ptr, D, D, PDL)  # the norm weights; the heads are the projection's output, in L2
    prefetch_vector(k_w_ptr, D, D, PDL)
    enter(PDL)
    norm_rope_store(
        rows // HEADS,
        rows % HEADS,
        rows < R,
        q_src_ptr,
        kv_src_ptr,
        q_w_ptr,
        k_w_ptr,
        cos_ptr,
        sin_ptr,
        q_ptr,
        kv_ptr,
        ck_ptr,
        cv_ptr,
        ks_ptr,
        vs_ptr,
        start_ptr,
        capacity,
        q_stride,
        kv_stride,
        eps,
        H,
        KVH,
        V_MODE,
        WEIGHT_AFTER_CAST,
        STORE,
        FP8,
        D,
    )


@triton.jit
def norm_rope_store(
    t,
    j,
    valid,
    q_src_ptr,
    kv_src_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    kv_ptr,
    ck_ptr,
    cv_ptr,
    ks_ptr,
    vs_ptr,
    start_ptr,
    capacity,
    q_stride,
    kv_stride,
    eps,
    H: tl.constexpr,
    KVH: tl.constexpr,
    V_MODE: tl.constexpr,
    WEIGHT_AFTER_CAST: tl.constexpr,
    STORE: tl.constexpr,
    FP8: tl.constexpr,
    D: tl.constexpr,
):
    """The head norms of (token t, head j) pairs [ROWS] where `valid` (as `_head_norms_kernel`
    describes them); the heads are read past L1 (.cg), so another program's fresh writes are seen."""
    KV_OUT: tl.constexpr = KVH if V_MODE == "none" else 2 * KVH
    cols = tl.arange(0, D)
    half = D // 2
    partner = tl.where(cols < half, cols + half, cols - half)
    ok = valid[:, None]
    is_q = (j < H)[:, None]
    src = tl.where(j < H, q_src_ptr + t * q_stride + j * D, kv_src_ptr + t * kv_stride + (j - H) * D)[:, None]
    x = tl.load(src + cols[None, :], mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    xp = tl.load(src + partner[None, :], mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    out_ty = q_ptr.dtype.element_ty
    n, n_partner = x * inv[:, None], xp * inv[:, None]
    if WEIGHT_AFTER_CAST:
        n, n_partner = n.to(out_ty).to(tl.float32), n_partner.to(out_ty).to(tl.float32)
    w = tl.where(is_q, tl.load(q_w_ptr + cols).to(tl.float32)[None, :], tl.load(k_w_ptr + cols).to(tl.float32)[None, :])
    wp = tl.where(
        is_q, tl.load(q_w_ptr + partner).to(tl.float32)[None, :], tl.load(k_w_ptr + partner).to(tl.float32)[None, :]
    )
    y = (n * w).to(out_ty).to(tl.float32)
    yp = (n_partner * wp).to(out_ty).to(tl.float32)
    yp = tl.where((cols < half)[None, :], -yp, yp)  # rotate_half: [-y2, y1]
    table = t[:, None] * D + cols[None, :]
    c = tl.load(cos_ptr + table, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + table, mask=ok, other=0.0).to(tl.float32)
    roped = ((y * c).to(out_ty).to(tl.float32) + (yp * s).to(out_ty).to(tl.float32)).to(out_ty)
    if H > 0:
        tl.store(q_ptr + ((t * H + j) * D)[:, None] + cols[None, :], roped, mask=ok & is_q)
    if V_MODE == "copy":
        v = x.to(out_ty)
    else:
        v = n.to(out_ty)
    if STORE:  # the cache's (slot, head) rows: k and v in their own stores
        k_row = ((tl.load(start_ptr).to(tl.int64) + t) % capacity) * KVH + j - H
        v_row = k_row if V_MODE == "k" else k_row - KVH
        k_dst, v_dst = ck_ptr, cv_ptr
    else:  # kv's rows [T, KV_OUT]: v after k
        k_row = t * KV_OUT + j - H
        v_row = k_row + KVH if V_MODE == "k" else k_row
        k_dst, v_dst = kv_ptr, kv_ptr
    k_ok = valid & (j >= H) & (j < H + KVH)
    store_quantized(roped, k_dst + (k_row * D)[:, None] + cols[None, :], ks_ptr + k_row, k_ok, FP8)
    if V_MODE != "none":
        v_ok = k_ok if V_MODE == "k" else valid & (j >= H + KVH)
        store_quantized(v, v_dst + (v_row * D)[:, None] + cols[None, :], vs_ptr + v_row, v_ok, FP8)


@triton.jit(do_not_specialize=["R"])
def _add_norm_kernel(
    h_ptr,
    y_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    R,
    D,
    eps,
    HAS_Y: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """sum = h + y (rounded), out = w * norm(sum) with the norm rounded before the weight (Qwen3)."""
    enter(PDL)
    _, cols, at, ok = row_tile(R, D, ROWS, BLOCK)
    out_ty = out_ptr.dtype.element_ty
    x = tl.load(h_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if HAS_Y:
        x = (x + tl.load(y_ptr + at, mask=ok, other=0.0).to(tl.float32)).to(out_ty).to(tl.float32)
        tl.store(sum_ptr + at, x.to(out_ty), mask=ok)
    n = (x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps))[:, None]).to(out_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + at, (n * w).to(out_ty), mask=ok)


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    d = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d
    if rows:
        per_program, block, warps = row_shape(d)
        res = residual.contiguous() if residual is not None else xc  # unused pointers stand in for absent ones
        _rms_norm_kernel[(triton.cdiv(rows, per_program),)](
            xc,
            weight if weight is not None else xc,
            res,
            scale if scale is not None else xc,
            out,
            rows,
            d,
            eps,
            HAS_WEIGHT=weight is not None,
            HAS_RESIDUAL=residual is not None,
            HAS_SCALE=scale is not None,
            ROWS=per_program,
            BLOCK=block,
            num_warps=warps,
            num_stages=LAUNCH_STAGES,
            **pdl_options(xc.device),
        )
    return out


STORE_WARPS = 8  # the int4 linear's: a decode step's q/k/v projection runs this code in its tail (qkv_triton)


def embed_norm_triton(
    ids: torch.Tensor, table: torch.Tensor, scale: float, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    d = table.shape[1]
    h = torch.empty((ids.shape[0], d), dtype=table.dtype, device=table.device)
    x = torch.empty_like(h)
    if ids.shape[0]:
        per_program, block, warps = row_shape(d)
        _embed_norm_kernel[(triton.cdiv(ids.shape[0], per_program),)](
            ids.contiguous(),
            table.contiguous(),
            weight,
            h,
            x,
            scale,
            ids.shape[0],
            d,
            eps,
            ROWS=per_program,
            BLOCK=block,
            num_warps=warps,
            num_stages=LAUNCH_STAGES,
            **pdl_options(table.device),
        )
    return h, x


def head_rows(d: int, store: bool = False) -> tuple[int, int]:
    """(heads per program, warps) of the head-norm kernel: 2048 elements a program, half the plain
    norm's tile (it holds each head twice, for RoPE's partner, and 32 heads of 128 spilled); 1024
    when it also quantizes K/V into the cache (2048 spilled 8 bytes), over 8 warps: the tile and the
    warps with which the fused q/k/v projection runs the same code, so both round alike."""
    return max(1, TILE // (4 if store else 2) // d), STORE_WARPS if store else 4


def heads_fusable(x: torch.Tensor | None, head_dim: int) -> bool:
    """Heads the fused kernel reads: rows [T, H, D] of contiguous heads (any row stride) of a
    power-of-two size (Gemma 4's 256 and 512, the drafter's 128)."""
    return x is None or (
        x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == head_dim and head_dim == triton.next_power_of_2(head_dim)
    )


def head_norms_triton(
    q: torch.Tensor | None,
    kv: torch.Tensor,
    q_w,
    k_w,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    kv_heads: int,
    v_mode: str,
    weight_after_cast: bool,
    into: KVSlots | None = None,
) -> tuple:
    """q [T, H, D] (or None) and kv [T, KVH or 2 KVH, D] heads as `heads_fusable` describes (kv's
    k heads first, then its v heads when v_mode is "norm" or "copy"). Returns (q or None, kv): kv
    [T, 2 KVH, D] with k then v, or [T, KVH, D] with k only when v_mode is "none"; with `into` (not
    with v_mode "none") k and v are stored in that cache instead and kv is None."""
    t, d = kv.shape[0], kv.shape[2]
    heads = 0 if q is None else q.shape[1]
    if not (heads_fusable(q, d) and heads_fusable(kv, d)):
        raise ValueError(
            f"head norms need contiguous heads of a power-of-two size, got kv {tuple(kv.shape)} "
            f"with strides {kv.stride()}"
        )
    heads_in = heads + kv_heads * (2 if v_mode in ("norm", "copy") else 1)
    q_out = None if q is None else torch.empty((t, heads, d), dtype=kv.dtype, device=kv.device)
    kv_out = None
    if into is None:
        kv_out = torch.empty((t, kv_heads if v_mode == "none" else 2 * kv_heads, d), dtype=kv.dtype, device=kv.device)
        cache = (kv_out, kv_out, kv_out, kv_out, kv_out, 1)  # unused stand-ins
    else:
        if v_mode == "none" or t > into.capacity:
            raise ValueError(f"storing into the cache needs a v and at most {into.capacity} tokens, got {t}")
        cache = _cache_args(into, kv_heads, d)
    if t:
        per_program, warps = head_rows(d, into is not None)
        _head_norms_kernel[(triton.cdiv(t * heads_in, per_program),)](
            kv if q is None else q,
            kv,
            k_w if q is None else q_w,
            k_w,
            cos.contiguous(),
            sin.contiguous(),
            kv if q_out is None else q_out,
            kv if kv_out is None else kv_out,
            *cache,
            t * heads_in,
            0 if q is None else q.stride(0),
            kv.stride(0),
            eps,
            H=heads,
            KVH=kv_heads,
            V_MODE=v_mode,
            WEIGHT_AFTER_CAST=weight_after_cast,
            STORE=into is not None,
            FP8=into is not None and into.k_scale is not None,
            D=d,
            ROWS=per_program,
            num_warps=warps,
            num_stages=LAUNCH_STAGES,
            maxnreg=MAX_REGISTERS,
            **pdl_options(kv.device),
        )
    return q_out, kv_out


def _cache_args(into: KVSlots, kv_heads: int, head_dim: int) -> tuple:
    """The kernel's cache arguments: fp8 caches as bytes, the scales (or stand-ins), start, capacity."""
    if into.k.shape[1:] != (kv_heads, head_dim) or not (into.k.is_contiguous() and into.v.is_contiguous()):
        raise ValueError(f"cache {tuple(into.k.shape)} does not hold contiguous [slots, {kv_heads}, {head_dim}] heads")
    if into.k_scale is None:
        return into.k, into.v, into.k, into.v, into.start, into.capacity
    return (into.k.view(torch.uint8), into.v.view(torch.uint8), into.k_scale, into.v_scale, into.start, into.capacity)


def add_norm_triton(h: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple:
    """(h + y, w * norm(h + y)) of rows [T, D], or (h, w * norm(h)) without y."""
    if h.dim() != 2:
        raise ValueError(f"add_norm takes rows [T, D], got {tuple(h.shape)}")
    h = h.contiguous()
    t, d = h.shape
    total = torch.empty_like(h) if y is not None else h
    out = torch.empty_like(h)
    if t:
        per_program, block, warps = row_shape(d)
        _add_norm_kernel[(triton.cdiv(t, per_program),)](
            h,
            h if y is None else y.contiguous(),
            weight,
            total,
            out,
            t,
            d,
            eps,
            HAS_Y=y is not None,
            ROWS=per_program,
            BLOCK=block,
            num_warps=warps,
            num_stages=LAUNCH_STAGES,
            **pdl_options(h.device),
        )
    return total, out


def compile_specs() -> list[CompileSpec]:
    """Hidden 2816 (layer norms, the router's; fused with the residual add, and with the layer
    scalar), head dims 256 and 512 (v norms without a weight; q/k norms fused with RoPE), bf16 rows,
    fp32 weights; and Gemma 4's MTP assistant's: its width 1024 and its q norms (head dims 256
    and 512, with a weight, RoPE apart)."""
    specs = []
    variants = [
        (2816, True, False, False),
        (2816, False, False, False),
        (256, False, False, False),
        (512, False, False, False),
        (2816, True, True, False),
        (2816, True, True, True),
        (1024, True, False, False),
        (256, True, False, False),
        (512, True, False, False),
    ]
    for d, has_weight, has_residual, has_scale in variants:
        per_program, block, warps = row_shape(d)
        flags: dict[str, object] = {
            "HAS_WEIGHT": has_weight,
            "HAS_RESIDUAL": has_residual,
            "HAS_SCALE": has_scale,
            "ROWS": per_program,
            "BLOCK": block,
        }
        fused = (",residual" if has_residual else "") + (",scale" if has_scale else "")
        name = f"rms_norm[D={d},weight={has_weight}{fused}]"
        specs.append(
            CompileSpec(
                name,
                _rms_norm_kernel,
                {
                    "x_ptr": "*bf16",
                    "w_ptr": "*fp32" if has_weight else "*bf16",
                    "res_ptr": "*bf16",
                    "scale_ptr": "*bf16",
                    "out_ptr": "*bf16",
                    "R": "i32",
                    "D": "i32",
                    "eps": "fp32",
                    **dict.fromkeys(flags, "constexpr"),
                },
                flags,
                num_warps=warps,
            )
        )
    # target: sliding layers (16 q, 8 k, 8 v heads of 256), full layers (16 q, 2 k heads of 512, v = k
    # or its own) (prefill: k and v returned; decode and verify: stored into an fp8 or bf16 cache);
    # drafter (Qwen3 norms, v as projected): its block's q and k, its context's k, or either storing
    # k and v into its bf16 context
    target = [(16, 8, 256, "norm"), (16, 2, 512, "k"), (16, 2, 512, "norm")]
    heads_specs = [(h, kvh, d, v, False, store) for h, kvh, d, v in target for store in (None, "fp8", "bf16")]
    heads_specs += [
        (32, 8, 128, "none", True, None),
        (0, 8, 128, "none", True, None),
        (32, 8, 128, "copy", True, "bf16"),
        (0, 8, 128, "copy", True, "bf16"),
    ]
    for heads, kv_heads, d, v_mode, after_cast, store in heads_specs:
        per_program, warps = head_rows(d, store is not None)
        flags = {
            "H": heads,
            "KVH": kv_heads,
            "V_MODE": v_mode,
            "WEIGHT_AFTER_CAST": after_cast,
            "STORE": store is not None,
            "FP8": store == "fp8",
            "D": d,
            "ROWS": per_program,
        }
        weight = "*bf16" if after_cast else "*fp32"
        cache = (
            {"ck_ptr": "*u8", "cv_ptr": "*u8", "ks_ptr": "*fp32", "vs_ptr": "*fp32"}
            if store == "fp8"
            else dict.fromkeys(("ck_ptr", "cv_ptr", "ks_ptr", "vs_ptr"), "*bf16")
        )
        types = {
            "q_src_ptr": "*bf16",
            "kv_src_ptr": "*bf16",
            "q_w_ptr": weight,
            "k_w_ptr": weight,
            "cos_ptr": "*bf16",
            "sin_ptr": "*bf16",
            "q_ptr": "*bf16",
            "kv_ptr": "*bf16",
            **cache,
            "start_ptr": "*i32" if store else "*bf16",
            "capacity": "i32",
            "R": "i32",
            "q_stride": "i32",
            "kv_stride": "i32",
            "eps": "fp32",
        }
        specs.append(
            CompileSpec(
                f"head_norms[D={d},H={heads},KVH={kv_heads},v={v_mode}{',qwen' if after_cast else ''}"
                f"{f',into {store} cache' if store else ''}]",
                _head_norms_kernel,
                {name: types.get(name, "constexpr") for name in _head_norms_kernel.arg_names},
                flags,
                num_warps=warps,
                maxnreg=MAX_REGISTERS,
            )
        )
    per_program, block, warps = row_shape(2816)  # a step's embedding and the first layer's input norm
    embed = {"ids_ptr": "*i64", "table_ptr": "*bf16", "w_ptr": "*fp32", "h_ptr": "*bf16", "x_ptr": "*bf16"}
    embed |= {"scale": "fp32", "R": "i32", "D": "i32", "eps": "fp32", "ROWS": "constexpr", "BLOCK": "constexpr"}
    specs.append(
        CompileSpec(
            "embed_norm[D=2816]", _embed_norm_kernel, embed, {"ROWS": per_program, "BLOCK": block}, num_warps=warps
        )
    )
    for has_y in (True, False):  # the drafter's residual adds with the next norm; its context's norm
        per_program, block, warps = row_shape(2816)
        flags = {"HAS_Y": has_y, "ROWS": per_program, "BLOCK": block}
        specs.append(
            CompileSpec(
                f"add_norm[D=2816{',y' if has_y else ''}]",
                _add_norm_kernel,
                {
                    "h_ptr": "*bf16",
                    "y_ptr": "*bf16",
                    "w_ptr": "*bf16",
                    "sum_ptr": "*bf16",
                    "out_ptr": "*bf16",
                    "R": "i32",
                    "D": "i32",
                    "eps": "fp32",
                    **dict.fromkeys(flags, "constexpr"),
                },
                flags,
                num_warps=warps,
            )
        )
    return specs
