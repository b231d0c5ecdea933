"""CUDA graphs of the target's decode and verify forwards: one per block length, captured once.

At batch 1 a step is hundreds of small kernels, and launching them one by one from Python costs
more than running them. A graph records the whole forward once and replays it with one launch.
It can, because `Gemma4.compute` on the Triton path reads the start position from the device and
takes no shape from a tensor value: the same graph serves every position. Inputs go through a
static id buffer; outputs are the tensors captured with the graph, valid until the next replay.

Capture needs the Triton kernels (the torch attention path slices the cache by host integers).
When capture fails, `error` says why and every step runs eagerly; `doctor` reports it.
"""

from __future__ import annotations

import os

import torch

from flashdesk.engine.model.gemma4 import ForwardOutput, Gemma4
from flashdesk.engine.model.kv_cache import KVCache
from flashdesk.kernels.backend import use_triton

MAX_ROWS = 16  # the anchor and up to 15 drafts: DFlash's block


def graphs_wanted(device: torch.device) -> tuple[bool, str]:
    """Whether steps on this device should be captured, and in words why (not)."""
    if device.type != "cuda":
        return False, "not used on the CPU"
    if os.environ.get("FLASHDESK_CUDA_GRAPHS", "1") == "0":
        return False, "off (FLASHDESK_CUDA_GRAPHS=0)"
    if not use_triton(device):
        return False, "off: the torch kernels are in use (FLASHDESK_KERNELS=torch)"
    return True, "on"


class StepGraphs:
    """Captured forwards of 1..MAX_ROWS tokens over one KV cache (which must outlive them)."""

    def __init__(self, model: Gemma4, cache: KVCache, taps: tuple[int, ...]):
        self.model, self.cache, self.taps = model, cache, taps
        self.ids = torch.zeros(MAX_ROWS, dtype=torch.long, device=model.device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, ForwardOutput]] = {}
        self.error: str | None = None

    def covers(self, rows: int) -> bool:
        return self.error is None and rows <= MAX_ROWS

    def run(self, ids: torch.Tensor) -> ForwardOutput:
        """The forward of ids [m] at cache.length (not committed: the caller advances the cache)."""
        m = ids.shape[0]
        self.ids[:m].copy_(ids)
        if m not in self.graphs:
            try:
                self.graphs[m] = self._capture(m)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
                self.error = f"{type(exc).__name__}: {exc}"
                torch.cuda.synchronize()
                with torch.inference_mode():
                    return self.model.compute(self.ids[:m], self.cache, self.taps, "all")
        graph, out = self.graphs[m]
        graph.replay()
        return out

    @torch.inference_mode()
    def _capture(self, m: int):
        ids = self.ids[:m]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile the Triton kernels and settle the allocator first;
            for _ in range(2):  # the K/V written past cache.length are overwritten before any read
                self.model.compute(ids, self.cache, self.taps, "all")
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.compute(ids, self.cache, self.taps, "all")
        return graph, out
