"""Compute kernels: each a plain-torch reference plus, later, a Triton kernel behind one dispatcher."""
