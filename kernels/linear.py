"""Linear layers: y = x @ W.T for the weight formats the engine keeps in memory.

Today every weight is a dense tensor; the 4-bit packed format and its Triton GEMV/GEMM will be
dispatched here, so the model code calls `linear()` and never looks at the format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)
