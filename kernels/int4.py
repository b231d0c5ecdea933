"""The engine's one 4-bit weight format: compressed-tensors `pack-quantized` int4, kept packed.

Layout (the checkpoint's own, so loading copies nothing and kernels read it directly):
- `packed`  int32 [..., out, in/8]: element i of a row sits in word i // 8, bits 4*(i % 8) .. +4
  (least significant nibble first), stored as q + 8 with q in [-8, 7];
- `scale`   [..., out, in/group] in the model dtype;
- `zero`    int8 [..., out, in/group] in the q domain, or None when symmetric.
w[o, i] = (q[o, i] - zero[o, i // group]) * scale[o, i // group]. A leading expert dimension is
allowed (MoE). The plain-torch path dequantizes one matmul's weight at a time; nothing keeps a
dequantized copy of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Int4Weight:
    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 8)

    def __getitem__(self, index) -> "Int4Weight":
        """Select experts along the leading dimension (an int or an index tensor)."""
        zero = None if self.zero is None else self.zero[index]
        return Int4Weight(self.packed[index], self.scale[index], zero, self.group_size)

    def nbytes(self) -> int:
        parts = [self.packed, self.scale] + ([self.zero] if self.zero is not None else [])
        return sum(t.numel() * t.element_size() for t in parts)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        nibbles = self.packed.contiguous().view(torch.uint8)  # 4 bytes per word, little-endian
        q = torch.stack([nibbles & 0xF, nibbles >> 4], dim=-1).flatten(-2).to(torch.int16) - 8
        groups = q.view(*q.shape[:-1], -1, self.group_size)
        if self.zero is not None:
            groups = groups - self.zero.to(torch.int16).unsqueeze(-1)
        w = groups.to(dtype) * self.scale.to(dtype).unsqueeze(-1)
        return w.view(self.shape)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int values in [-8, 7], [..., in] (in a multiple of 8) -> packed int32 [..., in/8]."""
    u = (q.to(torch.int16) + 8).to(torch.uint8).view(*q.shape[:-1], -1, 2)
    return (u[..., 0] | (u[..., 1] << 4)).contiguous().view(torch.int32)


def quantize_int4(w: torch.Tensor, group_size: int = 32) -> Int4Weight:
    """Symmetric round-to-nearest int4 with one scale per group of `group_size` inputs.

    The scale follows compressed-tensors (absmax / 7.5 over [-8, 7], and its dtype's eps where that
    is 0), so an on-load quantized weight is exactly what that library would have written to disk.
    """
    if w.shape[-1] % group_size:
        raise ValueError(f"input size {w.shape[-1]} is not a multiple of the group size {group_size}")
    groups = w.view(*w.shape[:-1], -1, group_size)
    # absmax as max(max, -min): the same value without an abs (and fp32) copy of the whole weight
    absmax = torch.maximum(groups.amax(dim=-1), groups.amin(dim=-1).neg()).float()
    scale = (absmax / 7.5).to(w.dtype)
    scale = torch.where(scale == 0, torch.finfo(w.dtype).eps, scale)  # an all-zero group: no 0 / 0
    # divide in the weight's dtype, as compressed-tensors does, so the packed bytes are identical
    q = torch.clamp(torch.round(groups / scale.unsqueeze(-1)), -8, 7).to(torch.int8)
    return Int4Weight(pack_int4(q.view(w.shape)), scale, None, group_size)


def weight_nbytes(weight) -> int:
    """Bytes one use of a weight reads: a dense tensor, an Int4Weight (packed + scales + zeros), or
    a tuple, list or dict of them; anything else (None, sizes, flags) reads nothing."""
    if isinstance(weight, Int4Weight):
        return weight.nbytes()
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    if isinstance(weight, dict):
        weight = list(weight.values())
    return sum(weight_nbytes(part) for part in weight) if isinstance(weight, (tuple, list)) else 0


def as_dense(weight, dtype: torch.dtype) -> torch.Tensor:
    """A weight as a dense tensor of `dtype` (dequantized when it is int4)."""
    return weight.dequantize(dtype) if isinstance(weight, Int4Weight) else weight
