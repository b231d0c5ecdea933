"""Preallocated K/V storage for one sequence: full layers sized to the context, sliding layers as rings.

Why rings of `window + slack`: a sliding layer needs only the last `window` keys, but speculative
decoding writes a block of up to `slack + 1` tokens and may reject all but the first; the extra
`slack` slots keep every key the next step needs, so rollback is just `length = n` (O(1)).

Storage dtypes: bf16, fp32, or fp8 e4m3. fp8 keeps one fp32 scale per (token, KV head), set from
that head vector's absolute maximum (amax / 448), which bounds the relative error of each element
by e4m3's 3-bit mantissa (about 6%, typically ~2%) whatever the magnitude of the vector. The scales
cost 4 bytes per 256 or 512 bytes of data.

Every write is read back through the same quantization before use, so a token attends to the same
key values whether it was processed alone (AR) or inside a verify block: speculation cannot change
the numbers the model sees.

`attend()` is the model's one entry: on the Triton path a decode or verify block (up to 16 tokens,
and at most slack + 1) is written by one kernel and attended in place, addressed by slot, with the
block's start read from `position` on the device, so the step has no host-side shapes and can be a
CUDA graph.
Longer blocks (prefill chunks) read a sliding layer's visible keys before writing, since a chunk
may overwrite ring slots its own first queries still need; a full layer's fp8 keys are read where
they are stored by the Triton prefill kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashdesk.kernels.attention import DECODE_QUERIES, attention, attention_in_place
from flashdesk.kernels.backend import STEP_FAMILIES, use_triton
from flashdesk.kernels.kv_write import FP8, FP8_MAX, KVSlots  # noqa: F401 (FP8_MAX re-exported)
from flashdesk.kernels.kv_write import quantize_reference as quantize

STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "fp8": FP8}


@dataclass(frozen=True)
class CacheLayout:
    """What one layer stores: heads, head size, and the sliding window (None for full attention)."""

    num_kv_heads: int
    head_dim: int
    window: int | None


class _LayerStore:
    """K and V for one layer, plus per-(token, head) scales when stored as fp8."""

    def __init__(self, layout: CacheLayout, capacity: int, dtype: torch.dtype, device):
        shape = (capacity, layout.num_kv_heads, layout.head_dim)
        self.layout, self.capacity = layout, capacity
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        scaled = dtype == FP8
        self.k_scale = torch.ones(shape[:2], dtype=torch.float32, device=device) if scaled else None
        self.v_scale = torch.ones(shape[:2], dtype=torch.float32, device=device) if scaled else None

    def nbytes(self) -> int:
        tensors = [self.k, self.v, self.k_scale, self.v_scale]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def dequantize(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return stored.to(dtype)
    return stored.float().mul_(scale.unsqueeze(-1)).to(dtype)  # in place: one fp32 copy at a time


class KVCache:
    """The K/V cache of one sequence across all layers; `length` positions are committed."""

    def __init__(
        self,
        layouts: list[CacheLayout],
        max_context: int,
        storage: str,
        compute_dtype: torch.dtype,
        device,
        slack: int = 16,
    ):
        if storage not in STORAGE_DTYPES:
            raise ValueError(f"unknown KV storage dtype {storage!r}; choose from {', '.join(STORAGE_DTYPES)}")
        self.max_context, self.storage, self.slack = max_context, storage, slack
        self.compute_dtype = compute_dtype
        dtype = STORAGE_DTYPES[storage]
        self.layers = [
            _LayerStore(lay, max_context if lay.window is None else min(max_context, lay.window + slack), dtype, device)
            for lay in layouts
        ]
        self.length = 0
        self.high = 0  # one past the highest position written since the rings were last consistent
        self.position = torch.zeros(1, dtype=torch.int32, device=device)  # `length`, where step kernels read it

    def nbytes(self) -> int:
        return sum(store.nbytes() for store in self.layers)

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Store K/V [T, Hkv, Dh] for positions start..start+T-1 and return what those queries see.

        Returns (K, V, key_positions): keys and values in position order, as stored (dequantized,
        but a full layer's fp8 keys on the Triton path, returned as stored), covering every position
        a query of this block may attend to under its layer's window.
        """
        store = self.layers[layer]
        t = k.shape[0]
        end = start + t
        self._check_write(start, t)
        dtype = self.compute_dtype
        kq, ks = quantize(k, store.k.dtype)
        vq, vs = quantize(v, store.v.dtype)
        window = store.layout.window
        if window is None:
            self._write(store, torch.arange(start, end, device=k.device), kq, ks, vq, vs)
            positions = torch.arange(0, end, device=k.device)
            if self._in_place(store):
                return store.k[:end], store.v[:end], positions
            return (
                dequantize(store.k[:end], _first(store.k_scale, end), dtype),
                dequantize(store.v[:end], _first(store.v_scale, end), dtype),
                positions,
            )
        lo = max(0, start - window + 1)
        old = torch.arange(lo, start, device=k.device)
        slots = old % store.capacity
        keys = torch.cat([dequantize(store.k[slots], _at(store.k_scale, slots), dtype), dequantize(kq, ks, dtype)])
        values = torch.cat([dequantize(store.v[slots], _at(store.v_scale, slots), dtype), dequantize(vq, vs, dtype)])
        keep = min(t, store.capacity)  # only the newest `capacity` positions fit in the ring
        new_pos = torch.arange(end - keep, end, device=k.device)
        self._write(store, new_pos, kq[-keep:], _tail(ks, keep), vq[-keep:], _tail(vs, keep))
        return keys, values, torch.arange(lo, end, device=k.device)

    def _write(self, store: _LayerStore, positions, kq, ks, vq, vs) -> None:
        slots = positions if store.layout.window is None else positions % store.capacity
        store.k[slots] = kq
        store.v[slots] = vq
        if ks is not None:  # quantized to fp8, so the store is fp8 and keeps scales
            assert store.k_scale is not None and store.v_scale is not None
            store.k_scale[slots] = ks
            store.v_scale[slots] = vs

    def block_slots(self, layer: int, t: int) -> KVSlots | None:
        """Where the step kernels store a decode or verify block's K/V (the Triton path, up to
        slack + 1 tokens and the decode attention's 16 queries: the kernel that makes K/V writes them
        into the cache, and `attend` gets k = v = None); None where `attend` takes k and v and stores
        them itself (longer blocks: a prompt's chunks, 17 tokens as well as 1024)."""
        store = self.layers[layer]
        triton = all(use_triton(store.k, family) for family in STEP_FAMILIES)
        if not (triton and t <= min(self.slack + 1, DECODE_QUERIES)):
            return None
        self._check_write(self.length, t)
        return KVSlots(store.k, store.v, store.k_scale, store.v_scale, self.position, store.capacity)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        positions: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Store the block's K/V [T, Hkv, Dh] at positions length.. (None: already stored at
        `block_slots`) and attend its queries [T, Hq, Dh] (at `positions`) over every key each may
        see under the layer's window. Returns [T, Hq, Dh]."""
        store = self.layers[layer]
        if k is None:
            return attention_in_place(
                q,
                store.k,
                store.v,
                store.k_scale,
                store.v_scale,
                self.position,
                store.layout.window,
                store.capacity,
                scale,
                self.max_context,
            )
        assert v is not None  # k and v come together, or neither
        keys, values, key_pos = self.update(layer, self.length, k, v)
        if self._in_place(store):
            assert store.k_scale is not None and store.v_scale is not None  # in place: fp8 keys
            end = keys.shape[0]
            return attention(
                q,
                keys,
                values,
                positions,
                key_pos,
                None,
                scale,
                k_scale=store.k_scale[:end],
                v_scale=store.v_scale[:end],
            )
        return attention(q, keys, values, positions, key_pos, store.layout.window, scale)

    @staticmethod
    def _in_place(store: _LayerStore) -> bool:
        """Whether a prefill chunk reads this layer's fp8 keys where they are stored: a full layer on
        the Triton path (its kernel converts them as it reads), so no chunk dequantizes the whole
        context (a cost that grew with the square of the prompt, and ~2 GB of workspace at 256K)."""
        return store.layout.window is None and store.k_scale is not None and use_triton(store.k, "prefill_attention")

    def _check_write(self, start: int, t: int) -> None:
        if start != self.length or start + t > self.max_context:
            raise IndexError(
                f"KV write at {start}..{start + t} does not follow length {self.length} "
                f"within the context limit {self.max_context}"
            )

    def advance(self, t: int) -> None:
        """Commit t positions after every layer has been updated for them."""
        self.length += t
        self.high = max(self.high, self.length)
        self.position.fill_(self.length)

    def reset(self) -> None:
        """Forget everything: the next forward starts a new sequence (the buffers are reused)."""
        self.length = self.high = 0
        self.position.fill_(0)

    def can_rollback(self, length: int) -> bool:
        """Whether every ring still holds the window a query at `length` needs: writes up to `high`
        have overwritten the slots of positions before high - capacity (ring_keeps)."""
        return 0 <= length <= self.length and all(
            ring_keeps(length, self.high, s.capacity, s.layout.window) for s in self.layers
        )

    def rollback(self, length: int) -> None:
        """Forget positions >= length (rejected draft tokens, or a conversation's divergent tail).
        O(1): nothing is copied. `high` stays: the rings' slots past `length` hold rejected keys."""
        if length > self.length or length < 0:
            raise ValueError(f"cannot roll back to {length}: cache holds {self.length} positions")
        if not self.can_rollback(length):
            raise ValueError(
                f"cannot roll back {self.high - length} positions: sliding rings keep "
                f"only {self.slack + 1} beyond the window"
            )
        self.length = length
        self.position.fill_(length)

    def buffers(self) -> list[tuple[torch.Tensor, bool]]:
        """Every stored tensor, each with whether it is a ring (indexed by slot, not position):
        what a prefix cache copies to keep this sequence."""
        out = []
        for store in self.layers:
            ring = store.layout.window is not None and store.capacity < self.max_context
            out += [(t, ring) for t in (store.k, store.v, store.k_scale, store.v_scale) if t is not None]
        return out

    def place(self, length: int, high: int) -> None:
        """Set the committed length after the buffers were restored from a copy."""
        self.length, self.high = length, high
        self.position.fill_(length)

    def visible(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a query at position `length` would attend to from the past: (K, V, positions)."""
        store = self.layers[layer]
        window = store.layout.window
        lo = 0 if window is None else max(0, self.length - window + 1)
        positions = torch.arange(lo, self.length, device=store.k.device)
        slots = positions if window is None else positions % store.capacity
        return (
            dequantize(store.k[slots], _at(store.k_scale, slots), self.compute_dtype),
            dequantize(store.v[slots], _at(store.v_scale, slots), self.compute_dtype),
            positions,
        )

    def attend_span(self, layer: int, q: torch.Tensor, lo: int, hi: int, keep: int | None) -> torch.Tensor:
        """One query row q [1, Hq, D] at scale 1 over the keys of positions max(lo, hi - keep)..hi-1
        as written (committed or not: a verify block's rejected keys too; keep None: all from lo),
        with no causal order among them: on the Triton path where they lie (the decode attention
        of a query at hi - 1 whose window reaches back to the first of them), else over a
        dequantized copy (`read`). Gemma 4's MTP assistant attends this way."""
        store = self.layers[layer]
        first = lo if keep is None else max(lo, hi - keep)
        if q.shape[0] == 1 and use_triton(store.k, "decode_attention"):
            # the query's position as an offset from `position`, on the device: an int would be
            # copied over, and the copy waits for the device
            at = self.position + (hi - 1 - self.length)
            if keep is None and (lo or store.layout.window is not None):
                raise ValueError("a span without a bound is a full layer's, from position 0")
            # from 0 the kernel stops at 0 itself: one window size there, so one compiled kernel
            window = None if keep is None else keep if first == 0 else hi - first
            return attention_in_place(
                q,
                store.k,
                store.v,
                store.k_scale,
                store.v_scale,
                at,
                window,
                store.capacity,
                1.0,
                self.max_context,
            )
        k, v = self.read(layer, first, hi)
        seen = torch.zeros(k.shape[0], dtype=torch.long, device=q.device)
        return attention(q, k.to(q.dtype), v.to(q.dtype), seen[:1], seen, None, 1.0, causal=False)

    def read(self, layer: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [hi - lo, Hkv, Dh] of positions lo..hi-1 as written (committed or not: a verify
        block's rejected keys too, while their slots were not reused), in the compute dtype."""
        store = self.layers[layer]
        positions = torch.arange(lo, hi, device=store.k.device)
        slots = positions if store.layout.window is None else positions % store.capacity
        return (
            dequantize(store.k[slots], _at(store.k_scale, slots), self.compute_dtype),
            dequantize(store.v[slots], _at(store.v_scale, slots), self.compute_dtype),
        )


def ring_keeps(length: int, high: int, capacity: int, window: int | None) -> bool:
    """Whether a ring of `capacity` slots, written up to position `high`, still holds the keys a
    query at `length` attends to (positions from length - window + 1): a slot is overwritten by the
    position `capacity` after it."""
    return window is None or high <= capacity or length - window + 1 >= high - capacity


def _first(scale, n):
    return None if scale is None else scale[:n]


def _at(scale, slots):
    return None if scale is None else scale[slots]


def _tail(scale, n):
    return None if scale is None else scale[-n:]
