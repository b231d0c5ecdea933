"""Writing new K/V into the cache: quantize (fp8 e4m3 with one fp32 scale per token and head, or a
plain cast) and store at slot = position % capacity, in one Triton kernel on the Triton path.

The Triton write is bit-identical to the torch reference (`quantize_reference`, then stored by slot),
fp8 rounding included, so a cache filled by either path holds the same bytes. `start` is a
1-element device tensor so a decode step that writes the cache can be captured as a CUDA graph.
This module imports no Triton unless the Triton path runs (it is absent on some platforms).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashdesk.kernels.backend import device_start, faulty, injected_faults, use_triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


class KVSlots(NamedTuple):
    """Where a block's K/V go (`kv_write`'s destination arguments): a layer's caches [capacity, Hkv,
    D], their fp32 scales [capacity, Hkv] when fp8 (else None), the block's first position (a
    1-element int32 device tensor) and the capacity (slot = position % capacity)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    start: torch.Tensor
    capacity: int


def quantize_reference(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [..., D] -> (stored values, fp32 scale per vector or None): fp8 divides by amax / 448."""
    if dtype != FP8:
        return x.to(dtype), None
    scale = x.float().abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale.unsqueeze(-1)).to(FP8), scale


def kv_write_reference(k, v, cache_k, cache_v, k_scale, v_scale, start: torch.Tensor, capacity: int) -> None:
    """The definition: quantize, then store by slot (T <= capacity, so no slot is written twice)."""
    slots = (start.reshape(1).to(torch.int64) + torch.arange(k.shape[0], device=k.device)) % capacity
    for x, cache, scales in ((k, cache_k, k_scale), (v, cache_v, v_scale)):
        stored, scale = quantize_reference(x, cache.dtype)
        cache[slots] = stored
        if scale is not None:
            scales[slots] = scale


def kv_write(
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    start,
    capacity: int,
) -> None:
    """Store K/V [T, Hkv, D] of positions start..start+T-1 into caches [capacity, Hkv, D].

    Scales [capacity, Hkv] fp32 when the caches are fp8, else None. `start` is a 1-element
    int32/int64 device tensor (a Python int is copied to the device). When T exceeds the capacity
    only the newest `capacity` positions are kept, as a ring would.
    """
    start = device_start(start, k.device)
    keep = min(k.shape[0], capacity)
    if keep < k.shape[0]:
        start = start + (k.shape[0] - keep)
        k, v = k[-keep:], v[-keep:]
    if use_triton(k, "kv_write"):
        from flashdesk.kernels.attention_triton import kv_write_triton

        if "kv_write" in injected_faults():  # FLASHDESK_INJECT_FAULT: store wrong keys
            k = faulty("kv_write", k.clone())

        kv_write_triton(k, v, cache_k, cache_v, k_scale, v_scale, start, capacity)
    else:
        kv_write_reference(k, v, cache_k, cache_v, k_scale, v_scale, start, capacity)


def compile_specs():
    """The Triton write's specializations (the kernel lives with its fp8 codec in attention_triton)."""
    from flashdesk.kernels.attention_triton import kv_write_specs

    return kv_write_specs()
