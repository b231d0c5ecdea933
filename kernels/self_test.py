"""Kernel self-tests: every Triton kernel against its torch reference on this device, so the first
run on a card nobody here has tried cannot quietly give wrong answers (llama.cpp's test-backend-ops
is the model).

Each check runs one kernel family (a name in backend.KERNELS) under the Triton kernels and under
the torch references on the same random inputs: at the real model's shapes on a GPU (kernels the
engine compiles anyway), at small ones under the interpreter; both with 1, 5 and 16 rows, int4 with
and without zero points, split-K with its arrival counter, bf16 and fp8 KV at both layer kinds, a
cache length that is no multiple of any tile, a ring that wraps, tied router logits. A result
passes when the largest error, relative to the reference's largest value, is within the family's
tolerance and, where the engine relies on it, a 16-row block equals the same rows one at a time
bit for bit (batch invariance: speculation must not change what the model says). A kernel that
raises (a compile or launch failure) fails with its error.

`ensure(device)` runs them at load, once per (card, driver, torch, triton, flashdesk, injected
faults), keeps the results in the data folder, and sends every failed family to its torch path
(backend.fall_back). `flashdesk doctor --kernels` runs them on demand. Under Triton's interpreter
they run on the CPU, which is how CI checks them.
"""

from __future__ import annotations

import gc
import hashlib
import os
import json
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from flashdesk.kernels import backend
from flashdesk.kernels.backend import kernels

VERSION = 1  # of the checks: a change runs them again everywhere


@dataclass(frozen=True)
class Dims:
    """The shapes a check runs at: tiny under the interpreter, the real model's on a GPU (kernels
    the engine compiles anyway; an edge shape there would cost a compile on first load)."""

    hidden: int
    linear: tuple[int, int]  # (out, in) of the int4 linears
    dense_inter: int
    experts: int
    expert_inter: int
    top_k: int
    q_heads: int
    layers: tuple[tuple[int, int, int | None], ...]  # (head dim, KV heads, window) of each layer kind
    length: int  # keys before the block: not a multiple of any chunk or split
    group: int


TINY = Dims(
    hidden=320,
    linear=(40, 320),
    dense_inter=24,
    experts=8,
    expert_inter=32,
    top_k=2,
    q_heads=4,
    layers=((16, 1, 8), (64, 2, None)),
    length=75,
    group=32,
)
REAL = Dims(
    hidden=2816,
    linear=(2816, 2112),
    dense_inter=2112,
    experts=128,
    expert_inter=704,
    top_k=8,
    q_heads=16,
    layers=((256, 8, 1024), (512, 2, None)),
    length=1061,
    group=32,
)


@dataclass
class Result:
    name: str
    ok: bool
    max_error: float | None
    tolerance: float
    batch_invariant: bool | None  # None: not a property this family must have
    error: str | None = None
    seconds: float = 0.0


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, gen, device, dtype=torch.bfloat16, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _error(got, want) -> float:
    """The largest |got - want| over every tensor, relative to want's largest magnitude."""
    worst = 0.0
    for a, b in zip(_tensors(got), _tensors(want), strict=True):
        if a.shape != b.shape:
            return float("inf")
        a, b = a.float(), b.float()
        if not torch.isfinite(a).all():
            return float("inf")
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item())
    return worst


def _both(run: Callable[[], object]) -> tuple[object, object]:
    """run() on the Triton kernels, then on the torch references."""
    with kernels("triton"):
        got = run()
    with kernels("torch"):
        want = run()
    return got, want


def _rows_alone(run: Callable[[slice], object], rows: int = 16) -> bool:
    """Whether each row of run(slice(0, rows)) on the Triton kernels equals run of that row's slice
    alone, bit for bit (run takes the rows of every input it reads). Every row on a GPU; the
    first, a middle and the last under the interpreter, where each call takes a while."""
    probes = (0, rows // 3, rows - 1) if backend.interpreted() else range(rows)
    with kernels("triton"):
        block = _tensors(run(slice(0, rows)))
        for i in probes:
            alone = _tensors(run(slice(i, i + 1)))
            if not all(torch.equal(a[0], b[i]) for a, b in zip(alone, block)):
                return False
    return True


# ----------------------------------------------------------------------------- checks


def _int4(gen, shape: tuple, group: int, device, asym: bool = False):
    """Random packed int4 weights [..., out, in] with bf16 group scales (int8 zero points when asym)."""
    from flashdesk.kernels.int4 import Int4Weight

    groups = (*shape[:-1], shape[-1] // group)
    # random 32-bit words are eight random nibbles: drawn as packed (the experts' nibbles one by one
    # would be half a billion int64s at the real shapes)
    q = torch.randint(-(2**31), 2**31 - 1, (*shape[:-1], shape[-1] // 8), generator=gen, dtype=torch.int32)
    scale = (torch.rand(groups, generator=gen) * 0.02 + 0.005).to(torch.bfloat16)
    zero = torch.randint(-3, 4, groups, generator=gen).to(torch.int8).to(device) if asym else None
    return Int4Weight(q.to(device), scale.to(device), zero, group)


def _linear(d: Dims, device) -> tuple[float, bool]:
    from flashdesk.kernels.linear import capped_logits, linear

    gen = _gen(1)
    weights = (
        _int4(gen, d.linear, d.group, device),
        _int4(gen, d.linear, d.group, device, asym=True),
        _randn(d.experts, d.hidden, gen=gen, device=device, scale=0.05),
    )  # a router's, bf16
    worst, invariant = 0.0, True
    for weight in weights:
        x = _randn(16, weight.shape[1], gen=gen, device=device)
        for rows in (1, 5, 16):
            worst = max(worst, _error(*_both(lambda: linear(x[:rows], weight))))
        invariant &= _rows_alone(lambda rows: linear(x[rows], weight))
    # a head's logits with Gemma's final softcap in the epilogue: enough rows that K is not split
    # (the real head's path; on a GPU its compiled kernel), spread over the cap's curve
    k = d.hidden if device.type == "cuda" else 64
    head = _randn(32768 if device.type == "cuda" else 1024, k, gen=gen, device=device, scale=0.05)
    x = _randn(16, k, gen=gen, device=device, scale=15 / (0.05 * k**0.5))
    worst = max(worst, _error(*_both(lambda: capped_logits(x, head, 30.0))))
    return worst, invariant and _rows_alone(lambda rows: capped_logits(x[rows], head, 30.0))


def _glu_linear(d: Dims, device) -> tuple[float, bool]:
    from flashdesk.kernels.linear import glu_linear

    gen = _gen(2)
    gate_up = _int4(gen, (2 * d.dense_inter, d.hidden), d.group, device)
    x = _randn(16, d.hidden, gen=gen, device=device)
    worst, invariant = 0.0, True
    for activation in ("gelu_tanh", "silu"):
        for rows in (1, 16):
            worst = max(worst, _error(*_both(lambda: glu_linear(x[:rows], gate_up, activation))))
        invariant &= _rows_alone(lambda rows: glu_linear(x[rows], gate_up, activation))
    return worst, invariant


def _rms_norm(d: Dims, device) -> tuple[float, bool]:
    from flashdesk.kernels.norm import embed_and_norm, rms_norm

    gen = _gen(3)
    x, residual = (_randn(16, d.hidden, gen=gen, device=device, scale=3) for _ in range(2))
    w = (torch.rand(d.hidden, generator=gen) + 0.5).to(device)
    scale = torch.tensor([0.75], device=device, dtype=torch.bfloat16)
    worst = _error(*_both(lambda: rms_norm(x, w, 1e-6, residual, scale)))
    worst = max(worst, _error(*_both(lambda: rms_norm(x[:5], None, 1e-6))))
    # a step's embedding, its scale and the first norm (ids repeat, the last row of the table)
    table = _randn(64, d.hidden, gen=gen, device=device)
    ids = torch.tensor([3, 63, 0, 3, 17], device=device)
    worst = max(worst, _error(*_both(lambda: embed_and_norm(ids, table, 53.0, w, 1e-6))))
    return worst, _rows_alone(lambda rows: rms_norm(x[rows], w, 1e-6, residual[rows], scale)) and _rows_alone(
        lambda rows: embed_and_norm(ids[rows], table, 53.0, w, 1e-6), rows=5
    )


def _rope_tables(d: Dims, device) -> tuple[float, bool]:
    """A step's positions and each layer kind's RoPE tables, far into a long context (the angles'
    range reduction counts there)."""
    from flashdesk.kernels.rope import step_rope

    widths = [dim for dim, _, _ in d.layers]  # a kind's table is as wide as its heads
    freqs = torch.cat([(10000.0 ** (-torch.arange(0, w, 2) / w)).repeat(2) for w in widths]).to(device)
    ends = [sum(widths[: i + 1]) for i in range(len(widths))]
    spans = tuple((end - w, end) for end, w in zip(ends, widths))
    start = torch.tensor([200_003], dtype=torch.int32, device=device)

    def run(rows):
        return step_rope(start + rows.start, rows.stop - rows.start, freqs, spans, torch.bfloat16)

    got, want = _both(lambda: run(slice(0, 16)))
    exact = torch.equal(_tensors(got)[0], _tensors(want)[0])  # the positions themselves, not relative to ~2e5
    return _error(got, want) if exact else float("inf"), _rows_alone(run)


def _add_norm(d: Dims, device) -> tuple[float, bool]:
    from flashdesk.kernels.norm import add_qwen_norm

    gen = _gen(4)
    h, y = (_randn(16, d.hidden, gen=gen, device=device, scale=2) for _ in range(2))
    w = (torch.rand(d.hidden, generator=gen) + 0.5).to(device=device, dtype=torch.bfloat16)
    worst = max(
        _error(*_both(lambda: add_qwen_norm(h, y, w, 1e-6))), _error(*_both(lambda: add_qwen_norm(h, None, w, 1e-6)))
    )
    return worst, _rows_alone(lambda rows: add_qwen_norm(h[rows], y[rows], w, 1e-6))


def _rope(t: int, dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(t)[:, None] * (10000.0 ** (-torch.arange(0, dim, 2) / dim))[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device), angles.sin().to(device)


def _head_norms(d: Dims, device) -> tuple[float, bool]:
    """Gemma's q/k/v norms with RoPE (v a norm of its own or of k), returned or with K/V stored into
    a cache as decode steps store them; the drafter's q/k norms, and its store of k and v."""
    from flashdesk.kernels.kv_write import KVSlots
    from flashdesk.kernels.norm import drafter_qk_norms, drafter_store_kv, qkv_norms

    gen = _gen(5)
    worst, invariant = 0.0, True
    start = torch.tensor([5], dtype=torch.int32, device=device)
    for dim, kv_heads, _ in d.layers:
        cos, sin = _rope(16, dim, device)
        for k_eq_v in (False, True):
            width = (d.q_heads + kv_heads * (1 if k_eq_v else 2)) * dim
            qkv = _randn(16, width, gen=gen, device=device, scale=2)
            q_w, k_w = ((torch.rand(dim, generator=gen) + 0.5).to(device) for _ in range(2))

            def run(rows, qkv=qkv, q_w=q_w, k_w=k_w, dim=dim, kv_heads=kv_heads, k_eq_v=k_eq_v):
                return qkv_norms(qkv[rows], q_w, k_w, cos[rows], sin[rows], 1e-6, d.q_heads, kv_heads, dim, k_eq_v)

            worst = max(worst, _error(*_both(lambda: run(slice(0, 16)))))
            invariant &= _rows_alone(run)

            def stored(qkv=qkv, q_w=q_w, k_w=k_w, dim=dim, kv_heads=kv_heads, k_eq_v=k_eq_v):
                # a bf16 cache: in fp8 a value rounded differently before it is stored may land one fp8
                # step (1/8) away; the fp8 rounding itself is kv_write's check, the same code
                cache = _Cache(24, kv_heads, dim, False, device)
                into = KVSlots(cache.k, cache.v, None, None, start, cache.capacity)
                q = qkv_norms(qkv, q_w, k_w, cos, sin, 1e-6, d.q_heads, kv_heads, dim, k_eq_v, into)[0]
                return (q, *cache.read(torch.arange(5, 21)))

            worst = max(worst, _error(*_both(stored)))
        q = _randn(16, d.q_heads, dim, gen=gen, device=device)
        kv = _randn(16, 2 * kv_heads, dim, gen=gen, device=device)
        w = (torch.rand(dim, generator=gen) + 0.5).to(device=device, dtype=torch.bfloat16)
        worst = max(worst, _error(*_both(lambda: drafter_qk_norms(q, kv[:, :kv_heads], w, w, cos, sin, 1e-6))))

        def drafter_stored(q=q, kv=kv, w=w, dim=dim, kv_heads=kv_heads):
            cache = _Cache(24, kv_heads, dim, False, device)
            into = KVSlots(cache.k, cache.v, None, None, start, cache.capacity)
            return (drafter_store_kv(q, kv, w, w, cos, sin, 1e-6, into), *cache.read(torch.arange(5, 21)))

        worst = max(worst, _error(*_both(drafter_stored)))
    return worst, invariant


def _qkv_heads(d: Dims, device) -> tuple[float, bool]:
    """The q/k/v projection fused with the head norms and the K/V store (decode and verify blocks):
    both layer kinds, v its own or k's; q and the stored K/V against the torch path's with 1, 5 and
    16 rows in a bf16 cache, and each row alone against the 16-row block (q and the cache) in a
    bf16 and an fp8 cache."""
    from flashdesk.kernels.kv_write import KVSlots
    from flashdesk.kernels.qkv import attention_inputs

    gen = _gen(13)
    worst, invariant = 0.0, True
    start = torch.tensor([5], dtype=torch.int32, device=device)
    x = _randn(16, d.hidden, gen=gen, device=device)
    for dim, kv_heads, _ in d.layers:
        cos, sin = _rope(16, dim, device)
        for k_eq_v, fp8 in ((False, True), (True, False)):
            weight = _int4(gen, ((d.q_heads + kv_heads * (1 if k_eq_v else 2)) * dim, d.hidden), d.group, device)
            q_w, k_w = ((torch.rand(dim, generator=gen) + 0.5).to(device) for _ in range(2))

            def run(rows, weight=weight, q_w=q_w, k_w=k_w, dim=dim, kv_heads=kv_heads, k_eq_v=k_eq_v, fp8=fp8):
                cache = _Cache(24, kv_heads, dim, fp8, device)
                into = KVSlots(cache.k, cache.v, cache.k_scale, cache.v_scale, start + rows.start, cache.capacity)
                args = (q_w, k_w, cos[rows], sin[rows], 1e-6, d.q_heads, kv_heads, dim, k_eq_v, into)
                q = attention_inputs(x[rows], weight, *args)[0]
                positions = torch.arange(5 + rows.start, 5 + rows.stop)
                return q, *cache.read(positions)

            for rows in (1, 5, 16) if not fp8 else ():  # fp8: see _head_norms' bf16 cache
                worst = max(worst, _error(*_both(partial(run, slice(0, rows)))))
            invariant &= _rows_alone(run)
    return worst, invariant


def _layer_norms(d: Dims, device, which: str) -> tuple[float, bool]:
    from flashdesk.kernels.layer_norms import MlpOutWeights, RouterInput, attention_out_norms, mlp_out_norms

    gen = _gen(6)
    a, residual, dense = (_randn(16, d.hidden, gen=gen, device=device, scale=2) for _ in range(3))
    ws = [(torch.rand(d.hidden, generator=gen) + 0.5).to(device) for _ in range(5)]
    scale = (torch.rand(d.hidden, generator=gen) + 0.5).to(device=device, dtype=torch.bfloat16)
    scalar = torch.tensor([0.8], device=device, dtype=torch.bfloat16)
    experts = _randn(16, d.top_k, d.hidden, gen=gen, device=device, dtype=torch.float32)
    if which == "attention_out_norms":
        router = RouterInput(ws[2], scale, d.hidden**-0.5)

        def run(rows):
            return attention_out_norms(a[rows], residual[rows], 1e-6, ws[0], ws[1], router)

        return _error(*_both(lambda: run(slice(0, 16)))), _rows_alone(run)
    weights = MlpOutWeights(ws[0], ws[1], ws[2], scalar, ws[3])
    # the dense MLP's output as rows, and as the expert launch's three fp32 chunk partials
    parts = _randn(3, 16, d.hidden, gen=gen, device=device, dtype=torch.float32)
    runs = [
        lambda rows: mlp_out_norms(dense[rows], experts[rows], residual[rows], 1e-6, weights),
        lambda rows: mlp_out_norms(parts[:, rows], experts[rows], residual[rows], 1e-6, weights),
    ]
    worst = max(_error(*_both(lambda: run(slice(0, 16)))) for run in runs)
    return worst, all(_rows_alone(run) for run in runs)


def _o_proj_norms(d: Dims, device) -> tuple[float, bool]:
    """A decode step's o_proj fused with the norms after it (one row; int4, symmetric and not)
    against the torch path, and bit for bit against the same row in a 16-row block, which takes the
    projection and the norms' kernel apart: a verify block and a decode step round alike."""
    from flashdesk.kernels.layer_norms import RouterInput, o_proj_and_norms

    gen = _gen(14)
    worst, invariant = 0.0, True
    residual = _randn(16, d.hidden, gen=gen, device=device, scale=2)
    ws = [(torch.rand(d.hidden, generator=gen) + 0.5).to(device) for _ in range(3)]
    scale = (torch.rand(d.hidden, generator=gen) + 0.5).to(device=device, dtype=torch.bfloat16)
    for dim, _, _ in d.layers:  # each layer kind's o_proj: its heads' width in
        a = _randn(16, d.q_heads * dim, gen=gen, device=device)
        for asym in (False, True):
            o_proj = _int4(gen, (d.hidden, a.shape[1]), d.group, device, asym)
            for router in (RouterInput(ws[2], scale, d.hidden**-0.5), None):

                def run(rows, a=a, o_proj=o_proj, router=router):
                    return o_proj_and_norms(a[rows], o_proj, residual[rows], 1e-6, ws[0], ws[1], router)

                worst = max(worst, _error(*_both(partial(run, slice(0, 1)))))
                invariant &= _rows_alone(run)
    return worst, invariant


def _router(d: Dims, device) -> tuple[float, None]:
    """Against the routing rule written out: softmax, the top k with the lower index first among
    ties (torch.topk promises no order there), renormalized in a fixed order, times each scale."""
    from flashdesk.kernels.router import ordered_sum, route

    gen = _gen(7)
    logits = _randn(16, d.experts, gen=gen, device=device, scale=2).round(decimals=1)
    logits[:, 1] = logits[:, 0]  # ties
    scale = (torch.rand(d.experts, generator=gen) + 0.5).to(device)
    with kernels("triton"):
        weights, ids = route(logits, d.top_k, scale)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    want_ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, : d.top_k]
    top = probs.gather(-1, want_ids)
    if not torch.equal(ids.long(), want_ids):
        return float("inf"), None
    return _error(weights, top / ordered_sum(top).unsqueeze(-1) * scale[want_ids]), None


def _moe(d: Dims, device) -> tuple[float, bool]:
    """The routed experts and the dense MLP beside them as a decode or verify block runs them (the
    router's projection, routing, grouping and the expert launch, which also runs the dense MLP's
    expert-sized chunks, as in the real model, whose 2,112 is three experts' 704). Each token's
    router input is one-hot and the router's weights multiples of 1/16, so its logits are exact and
    distinct on every path: no tie can pick another expert on one of them (router's own check
    covers ties)."""
    from flashdesk.kernels.moe import DenseMlp, dense_and_routed_moe
    from flashdesk.kernels.router import ordered_sum

    gen = _gen(8)
    gate_up = _int4(gen, (d.experts, 2 * d.expert_inter, d.hidden), d.group, device)
    down = _int4(gen, (d.experts, d.hidden, d.expert_inter), d.group, device)
    dense_inter = max(1, d.dense_inter // d.expert_inter) * d.expert_inter  # whole experts: the fused path
    dense_gate_up = _int4(gen, (2 * dense_inter, d.hidden), d.group, device)
    dense_down = _int4(gen, (d.hidden, dense_inter), d.group, device)
    router = torch.zeros(d.experts, d.hidden)
    for t in range(16):
        router[:, t] = torch.randperm(d.experts, generator=gen) / 16
    router = router.to(device=device, dtype=torch.bfloat16)
    router_x = torch.eye(16, d.hidden).to(device=device, dtype=torch.bfloat16)
    scale = (torch.rand(d.experts, generator=gen) + 0.5).to(device)
    x, dense_x = (_randn(16, d.hidden, gen=gen, device=device) for _ in range(2))

    def rows_of(m, experts):  # either path's outputs as rows [T, D]: parts summed in order, rounded
        m = ordered_sum(m.movedim(0, -1)).to(x.dtype) if m.dim() == 3 else m
        return m, ordered_sum(experts.movedim(1, -1)).to(x.dtype) if experts.dim() == 3 else experts

    def run(rows):
        dense = DenseMlp(dense_x[rows], dense_gate_up, dense_down)
        return rows_of(*dense_and_routed_moe(dense, x[rows], gate_up, down, router_x[rows], router, d.top_k, scale))

    worst = max(_error(*_both(lambda: run(slice(0, rows)))) for rows in (1, 16))
    return worst, _rows_alone(run)


class _Cache:
    """One layer's cache as the engine keeps it, [capacity, Hkv, D] (fp32 scales for fp8)."""

    def __init__(self, capacity: int, kv_heads: int, dim: int, fp8: bool, device):
        from flashdesk.kernels.kv_write import FP8

        dtype = FP8 if fp8 else torch.bfloat16
        self.capacity = capacity
        self.k = torch.zeros(capacity, kv_heads, dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.k_scale = torch.ones(capacity, kv_heads, device=device) if fp8 else None
        self.v_scale = torch.ones(capacity, kv_heads, device=device) if fp8 else None

    def write(self, k, v, start: int) -> None:
        from flashdesk.kernels.kv_write import kv_write

        kv_write(
            k,
            v,
            self.k,
            self.v,
            self.k_scale,
            self.v_scale,
            torch.tensor([start], dtype=torch.int32, device=self.k.device),
            self.capacity,
        )

    def read(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = (positions % self.capacity).to(self.k.device)
        k, v = self.k[slots].float(), self.v[slots].float()
        if self.k_scale is not None and self.v_scale is not None:  # fp8: both scales or neither
            k, v = k * self.k_scale[slots, :, None], v * self.v_scale[slots, :, None]
        return k, v

    def state(self) -> list[torch.Tensor]:
        return [
            t.view(torch.uint8) if t.element_size() == 1 else t
            for t in (self.k, self.v, self.k_scale, self.v_scale)
            if t is not None
        ]


def _kv_write(d: Dims, device) -> tuple[float, None]:
    gen = _gen(9)
    worst = 0.0
    for fp8 in (False, True):
        for dim, kv_heads, _ in d.layers:
            k, v = (_randn(16, kv_heads, dim, gen=gen, device=device, scale=3) for _ in range(2))
            caches = []
            for choice in ("triton", "torch"):
                cache = _Cache(24, kv_heads, dim, fp8, device)
                with kernels(choice):
                    cache.write(k, v, 15)  # wraps the ring
                caches.append(cache)
            for got, want in zip(*(c.read(torch.arange(15, 31)) for c in caches)):
                worst = max(worst, _error(got, want))
    return worst, None


def _decode_attention(d: Dims, device) -> tuple[float, bool]:
    from flashdesk.kernels.attention import attention_reference
    from flashdesk.kernels.attention_triton import decode_attention

    gen = _gen(10)
    start, worst, invariant = d.length, 0.0, True
    end = start + 16
    for fp8 in (False, True):
        for dim, kv_heads, window in d.layers:
            k, v = (_randn(end, kv_heads, dim, gen=gen, device=device, scale=2) for _ in range(2))
            q = _randn(end, d.q_heads, dim, gen=gen, device=device)
            capacity = end + 16 if window is None else window + 16
            cache = _Cache(capacity, kv_heads, dim, fp8, device)
            with kernels("torch"):
                for lo in range(0, end, 16):
                    cache.write(k[lo : min(lo + 16, end)], v[lo : min(lo + 16, end)], lo)

            def attend(block_start, rows, cache=cache, window=window, capacity=capacity, causal=True):
                return decode_attention(
                    rows,
                    cache.k,
                    cache.v,
                    cache.k_scale,
                    cache.v_scale,
                    torch.tensor([block_start], dtype=torch.int32, device=device),
                    window,
                    capacity,
                    dim**-0.5,
                    capacity if window is None else end + 16,
                    causal=causal,
                )

            with kernels("triton"):
                block = attend(start, q[start:end])
            lo = 0 if window is None else max(0, start - window + 1)
            keys, values = cache.read(torch.arange(lo, end))
            want = attention_reference(
                q[start:end].float(),
                keys,
                values,
                torch.arange(start, end, device=device),
                torch.arange(lo, end, device=device),
                window,
                dim**-0.5,
            )
            worst = max(worst, _error(block, want))
            # the last query alone (its cache holds every earlier position already): same bits
            with kernels("triton"):
                alone = attend(end - 1, q[end - 1 : end])
            invariant &= torch.equal(alone[0], block[-1])
            if window is None:  # the drafter's full layers: every query of the block sees all of it
                with kernels("triton"):
                    both_ways = attend(start, q[start:end], causal=False)
                keys, values = cache.read(torch.arange(0, end))
                want = attention_reference(
                    q[start:end].float(),
                    keys,
                    values,
                    torch.arange(start, end, device=device),
                    torch.arange(0, end, device=device),
                    None,
                    dim**-0.5,
                    causal=False,
                )
                worst = max(worst, _error(both_ways, want))
    return worst, invariant


def _prefill_attention(d: Dims, device) -> tuple[float, None]:
    from flashdesk.kernels.attention import attention

    gen = _gen(11)
    worst = 0.0
    for dim, kv_heads, layer_window in d.layers:
        t, s = 37, 37 + d.length % 64
        q = _randn(t, d.q_heads, dim, gen=gen, device=device)
        k, v = (_randn(s, kv_heads, dim, gen=gen, device=device) for _ in range(2))
        q_pos, k_pos = torch.arange(s - t, s, device=device), torch.arange(s, device=device)
        for window in (None, layer_window):
            worst = max(worst, _error(*_both(lambda: attention(q, k, v, q_pos, k_pos, window, dim**-0.5))))
        cache = _Cache(s, kv_heads, dim, True, device)
        with kernels("torch"):
            cache.write(k, v, 0)
        worst = max(
            worst,
            _error(
                *_both(
                    lambda: attention(
                        q, cache.k, cache.v, q_pos, k_pos, None, dim**-0.5, k_scale=cache.k_scale, v_scale=cache.v_scale
                    )
                )
            ),
        )
    return worst, None


# name -> (check, tolerance): the tolerances sit well above the rounding differences between the
# kernels and the references (bf16 rounds at ~4e-3) and far below a wrong result
CHECKS: dict[str, tuple[Callable, float]] = {
    "linear": (_linear, 3e-2),
    "glu_linear": (_glu_linear, 3e-2),
    "rope": (_rope_tables, 1e-2),
    "rms_norm": (_rms_norm, 2e-2),
    "add_norm": (_add_norm, 2e-2),
    "head_norms": (_head_norms, 2e-2),
    "qkv_heads": (_qkv_heads, 3e-2),
    "attention_out_norms": (lambda d, dev: _layer_norms(d, dev, "attention_out_norms"), 2e-2),
    "o_proj_norms": (_o_proj_norms, 3e-2),
    "mlp_out_norms": (lambda d, dev: _layer_norms(d, dev, "mlp_out_norms"), 2e-2),
    "router": (_router, 1e-2),
    "moe": (_moe, 3e-2),
    "kv_write": (_kv_write, 1e-2),
    "decode_attention": (_decode_attention, 2e-2),
    "prefill_attention": (_prefill_attention, 2e-2),
}


def run_self_tests(device: torch.device, names=None) -> list[Result]:
    """Run the checks of `names` (default: every family) on the device; the Triton kernels run
    whatever backend.fallbacks says (a self-test decides them anew)."""
    dims = REAL if device.type == "cuda" else TINY
    results = []
    with backend.ignoring_fallbacks():
        for name in names or CHECKS:
            check, tolerance = CHECKS[name]
            start = time.perf_counter()
            try:
                error, invariant = check(dims, device)
                ok = error <= tolerance and invariant is not False
                result = Result(name, ok, error, tolerance, invariant)
            except Exception as exc:  # noqa: BLE001 - a kernel that cannot compile or launch fails its test
                result = Result(name, False, None, tolerance, None, f"{type(exc).__name__}: {exc}"[:500])
            result.seconds = round(time.perf_counter() - start, 2)
            results.append(result)
    if device.type == "cuda":  # give back what the checks allocated before the load measures free memory
        gc.collect()
        torch.cuda.empty_cache()
    return results


# ----------------------------------------------------------------------------- at load


def _identity(device: torch.device) -> dict:
    """What decides whether earlier results still hold: the card and its driver, the versions of
    torch, triton and flashdesk, the checks' version and any injected faults."""
    from importlib import metadata

    from flashdesk import __version__

    ident = {
        "checks": VERSION,
        "flashdesk": __version__,
        "torch": torch.__version__,
        "triton": metadata.version("triton"),
        "device": device.type,
        "interpreted": backend.interpreted(),
        "faults": sorted(backend.injected_faults()),
        "pdl": os.environ.get(backend.PDL_VARIABLE, ""),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ident |= {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "driver": _driver_version(),
        }
    return ident


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001 - without NVML the CUDA runtime's version stands in
        return None


def _cache_file(ident: dict) -> Path:
    from flashdesk import paths

    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
    return paths.data_dir() / "self-test" / f"{digest}.json"


def ensure(device: torch.device, announce: Callable[[], object] | None = None) -> list[Result]:
    """The self-tests' results for this device, run now (after `announce()`) unless kept from an
    earlier load with the same identity; every failed family goes to its torch path
    (backend.fall_back). Where kernels failed with programmatic dependent launch on, the failed ones
    run again without it; if they pass then, PDL stays off instead. Nothing to do where the Triton
    kernels do not run."""
    if not backend.use_triton(device):
        return []
    kept = kept_results(device)
    if kept is None:
        if announce is not None:
            announce()
        kept = run_and_keep(device)
    results, pdl = kept
    apply(results, pdl)
    return results


def run_and_keep(device: torch.device) -> tuple[list[Result], bool]:
    """Run every check (the failed ones again without PDL where it was on) and keep the results for
    the next load; returns them and whether PDL stays on."""
    backend.turn_off_pdl(None)
    results, pdl = _without_pdl_if_that_helps(device, run_self_tests(device))
    keep(device, results, pdl)
    return results, pdl


def _without_pdl_if_that_helps(device: torch.device, results: list[Result]) -> tuple[list[Result], bool]:
    """(results, False) where the failed families all pass without PDL (theirs replace the first),
    else (results, True): PDL is not what fails them, or not in use."""
    failed = [r.name for r in results if not r.ok]
    if not failed or not backend.pdl_options(device):
        return results, True
    backend.turn_off_pdl(PDL_OFF)
    again = {r.name: r for r in run_self_tests(device, failed)}
    backend.turn_off_pdl(None)
    if not all(r.ok for r in again.values()):
        return results, True  # PDL is not what fails them
    return [again.get(r.name, r) for r in results], False


PDL_OFF = "kernels failed their self-test with programmatic dependent launch and passed without it"


def kept_results(device: torch.device) -> tuple[list[Result], bool] | None:
    """The results (and whether PDL stays on) kept for this device's identity, or None."""
    ident = _identity(device)
    try:
        data = json.loads(_cache_file(ident).read_text())
        if data.get("identity") != ident:
            return None
        return [Result(**row) for row in data["results"]], bool(data.get("pdl", True))
    except (OSError, ValueError, TypeError, KeyError):
        return None  # none, or unreadable: run them again


def keep(device: torch.device, results: list[Result], pdl: bool = True) -> None:
    """Keep results (and whether PDL stays on) for the next load on this device; a doctor run
    replaces the load's. Not where a kernel raised: that may pass (out of memory, say), so the next
    load runs them again."""
    if any(r.error for r in results):
        return
    ident = _identity(device)
    where = _cache_file(ident)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps({"identity": ident, "pdl": pdl, "results": [asdict(r) for r in results]}, indent=1))
    except OSError:
        pass  # kept for this process only


def apply(results: list[Result], pdl: bool = True) -> None:
    """Send each failed family to its torch path (the others run on Triton again), and turn PDL
    off where the self-tests passed only without it."""
    backend.clear_fallbacks()
    backend.turn_off_pdl(None if pdl else PDL_OFF)
    for result in results:
        if not result.ok:
            backend.fall_back(result.name, why(result))


def why(result: Result) -> str:
    """A failed result in words."""
    if result.error:
        return f"it failed to run: {result.error}"
    if result.batch_invariant is False:
        return "a block's rows differ from the same rows computed alone"
    return f"off by {result.max_error:.3g} (tolerance {result.tolerance:g})"
