"""A step's positions and RoPE tables (kernels/rope.py) under Triton's interpreter: the torch
reference's within a last bit (the interpreter's cos is numpy's), each layer kind's table
contiguous, every row the same alone or in a block, bad inputs refused."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels import backend
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.rope import step_rope

pytestmark = pytest.mark.skipif(not backend.interpreted(), reason="needs TRITON_INTERPRET=1 before triton import")


def _freqs(widths, rotated=1.0):
    """Each kind's rotate-half frequencies side by side; a kind may leave its last columns still."""
    parts = []
    for w in widths:
        inv = 10000.0 ** (-torch.arange(0, w, 2, dtype=torch.float32) / w)
        inv[int(len(inv) * rotated) :] = 0.0
        parts.append(inv.repeat(2))
    ends = torch.tensor(widths).cumsum(0).tolist()
    return torch.cat(parts), tuple((end - w, end) for end, w in zip(ends, widths))


@pytest.mark.parametrize("start, count", [(0, 1), (4095, 1), (262_000, 16), (17, 40)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_gives_the_reference_bits(start, count, dtype):
    freqs, spans = _freqs((256, 512), rotated=0.25)
    at = torch.tensor([start], dtype=torch.int32)
    with kernels("triton"):
        positions, tables = step_rope(at, count, freqs, spans, dtype)
    with kernels("torch"):
        want_positions, want = step_rope(at, count, freqs, spans, dtype)
    assert positions.dtype == torch.int64 and torch.equal(positions, want_positions)
    assert torch.equal(positions, torch.arange(start, start + count))
    for (cos, sin), (want_cos, want_sin), (a, b) in zip(tables, want, spans):
        assert cos.shape == (count, b - a) and cos.dtype == dtype and cos.is_contiguous() and sin.is_contiguous()
        # numpy's cos (the interpreter's) and torch's may differ in fp32's last bit, which can move a
        # rounding to bf16 by one step (on a GPU both are the CUDA math library's: the self-test)
        ulp = 2**-8 if dtype == torch.bfloat16 else 2e-7
        torch.testing.assert_close(cos, want_cos, rtol=0, atol=ulp)
        torch.testing.assert_close(sin, want_sin, rtol=0, atol=ulp)


def test_a_row_alone_has_the_bits_it_has_in_a_block():
    freqs, spans = _freqs((32, 64, 16))
    at = torch.tensor([1000], dtype=torch.int32)
    with kernels("triton"):
        _, block = step_rope(at, 9, freqs, spans, torch.bfloat16)
        for i in (0, 4, 8):
            _, alone = step_rope(at + i, 1, freqs, spans, torch.bfloat16)
            assert all(torch.equal(x[0], y[i]) for pair, whole in zip(alone, block) for x, y in zip(pair, whole))


def test_bad_inputs_are_refused():
    freqs, spans = _freqs((32, 16))
    one = torch.tensor([1], dtype=torch.int32)
    with kernels("triton"):
        with pytest.raises(ValueError, match="one position"):
            step_rope(torch.tensor([1, 2], dtype=torch.int32), 2, freqs, spans, torch.bfloat16)
        with pytest.raises(ValueError, match="must be fp32"):
            step_rope(one, 2, freqs.to(torch.bfloat16), spans, torch.bfloat16)
        with pytest.raises(ValueError, match="in order"):
            step_rope(one, 2, freqs, ((32, 48), (0, 32)), torch.bfloat16)
