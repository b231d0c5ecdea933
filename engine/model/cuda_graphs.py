"""CUDA graphs of the decode, verify and draft passes: one per block length, captured once.

At batch 1 a step is hundreds of small kernels, and launching them one by one from Python costs
more than running them. A graph records the whole forward once and replays it with one launch.
It can, because `Gemma4.compute` on the Triton path reads the start position from the device and
takes no shape from a tensor value: the same graph serves every position. Inputs go through a
static id buffer; outputs are the tensors captured with the graph, valid until the next replay.

The drafter's block works the same way: its K/V are written into the drafter's context stores
past the held length and attended in place, the start read from the device. So does turning a
verified block's target features into the drafter's context K/V (one graph per row count).

Capture needs the Triton kernels (the torch attention path slices the cache by host integers).
Each capture's first replay must give the eager run's outputs (`replay_matches`). When a step type's
capture fails or replays otherwise (decode, verify, draft or context), `error` says which and why
and that step type runs eagerly; `doctor` and `generate --json` report it.
FLASHDESK_INJECT_FAULT=capture:STEP makes that step type's capture fail (a testing aid).
"""

from __future__ import annotations

import os

import torch

from flashdesk.engine.model.drafter import DraftContext, Drafter
from flashdesk.engine.model.gemma4 import ForwardOutput, Gemma4
from flashdesk.engine.model.kv_cache import KVCache
from flashdesk.kernels.backend import (
    FAULT_VARIABLE,
    fallbacks,
    injected_capture_fault,
    pdl_options,
    turn_off_pdl,
    use_triton,
)

MAX_ROWS = 16  # the anchor and up to 15 drafts: DFlash's block


def graphs_wanted(device: torch.device) -> tuple[bool, str]:
    """Whether steps on this device should be captured, and in words why (not)."""
    if device.type != "cuda":
        return False, "not used on the CPU"
    if os.environ.get("FLASHDESK_CUDA_GRAPHS", "1") == "0":
        return False, "off (FLASHDESK_CUDA_GRAPHS=0)"
    if not use_triton(device):
        return False, "off: the torch kernels are in use (FLASHDESK_KERNELS=torch)"
    if fallbacks():  # a torch kernel may slice by host integers: a replay would reuse the capture's
        return False, f"off: {', '.join(sorted(fallbacks()))} run on torch after their self-test"
    return True, "on"


class _Captured:
    """Graphs of one function of a static input buffer, keyed by the number of rows it runs. `kind`
    names its steps: "target" (decode for one row, verify for more), "draft" or "context"; a step
    type whose capture failed runs eagerly from then on, the others keep their graphs."""

    def __init__(self, inputs: torch.Tensor, pool, kind: str):
        self.inputs = inputs  # [MAX_ROWS, ...]: the rows the graphs read
        self.pool = pool
        self.kind = kind
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, object]] = {}
        self.errors: dict[str, str] = {}  # step type -> why its capture failed

    def step(self, m: int) -> str:
        if self.kind != "target":
            return self.kind
        return "decode" if m == 1 else "verify"

    @property
    def error(self) -> str | None:
        return "; ".join(f"{step}: {why}" for step, why in self.errors.items()) or None

    def covers(self, m: int) -> bool:
        return self.step(m) not in self.errors

    def run(self, fn, inputs: torch.Tensor, m: int):
        """fn(static inputs, m) for rows m, replayed from its graph (captured on first use)."""
        self.inputs[: inputs.shape[0]].copy_(inputs)
        if m not in self.graphs and self.covers(m):
            try:
                self.graphs[m] = self._capture(fn, m)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: this step runs eagerly
                self._failed(fn, m, f"{type(exc).__name__}: {exc}")
        if m not in self.graphs:
            with torch.inference_mode():
                return fn(self.inputs, m)
        graph, out = self.graphs[m]
        graph.replay()
        return out

    def _failed(self, fn, m: int, why: str) -> None:
        """A capture failed: where kernels launch with programmatic dependent launch, try once more
        without it (capturing its launches is newer in drivers than the rest), PDL then staying off;
        else the step type runs eagerly from now on."""
        if self.inputs.is_cuda:
            torch.cuda.synchronize()
        if pdl_options(self.inputs.device) and not injected_capture_fault(self.step(m)):
            turn_off_pdl(f"a CUDA graph capture failed with it ({why})")
            try:
                self.graphs[m] = self._capture(fn, m)
                return
            except Exception as exc:  # noqa: BLE001 - not PDL's doing: PDL back on, the step eager
                turn_off_pdl(None)
                why = f"{type(exc).__name__}: {exc}"
        self.errors[self.step(m)] = why

    @torch.inference_mode()
    def _capture(self, fn, m: int):
        if injected_capture_fault(self.step(m)):
            raise RuntimeError(f"{FAULT_VARIABLE}=capture:{self.step(m)} (a testing aid)")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile the Triton kernels and settle the allocator first;
            for _ in range(2):  # what they write past the held length is overwritten before any read
                eager = [t.clone() for t in _tensors(fn(self.inputs, m))]
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn(self.inputs, m)
        replay_matches(graph, out, eager)
        return graph, out


def replay_matches(graph, out, eager: list[torch.Tensor]) -> None:
    """Replay a freshly captured graph once and check that its outputs (a forward's logits, taps
    and hidden state; a draft's logits) are the eager run's bits on the same inputs, as the same
    kernels give: a graph whose kernels race once captured, or whose pool hands a live output's
    memory to another tensor, replays other bits. (A graph that froze a value the eager run reads
    anew would pass this first replay; that the steps read positions from the device and take no
    shape from a value is what the step tests check.) A context write returns nothing to compare.
    Raises RuntimeError on a difference, so the step type runs eagerly and says why."""
    graph.replay()
    for i, (got, want) in enumerate(zip(_tensors(out), eager, strict=True)):
        if not torch.equal(got, want):
            worst = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else float("nan")
            raise RuntimeError(f"its replay differs from the eager run (output {i}: largest difference {worst:.3g})")


def _tensors(value) -> list[torch.Tensor]:
    """The tensors of a step's output (a tensor, a ForwardOutput, None), in a fixed order."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in vars(value).values() if isinstance(t, torch.Tensor)]


class StepGraphs:
    """Captured target forwards of 1..MAX_ROWS tokens over one KV cache; over one drafter context,
    drafter blocks of 1..MAX_ROWS - 1 drafts and context updates of 1..MAX_ROWS positions (the
    cache and the context must outlive the graphs)."""

    def __init__(
        self,
        model: Gemma4,
        cache: KVCache,
        taps: tuple[int, ...],
        drafter: Drafter | None = None,
        ctx: DraftContext | None = None,
    ):
        self.model, self.cache, self.taps, self.drafter, self.ctx = model, cache, taps, drafter, ctx
        pool = torch.cuda.graph_pool_handle()
        ids = lambda: torch.zeros(MAX_ROWS, dtype=torch.long, device=model.device)  # noqa: E731
        self.target = _Captured(ids(), pool, "target")
        self.draft = _Captured(ids(), pool, "draft")
        width = len(taps) * model.cfg.hidden_size
        self.context = _Captured(torch.zeros(MAX_ROWS, width, dtype=model.dtype, device=model.device), pool, "context")

    @property
    def error(self) -> str | None:
        """Which step types' captures failed, and why (None: none did)."""
        return "; ".join(filter(None, (c.error for c in (self.target, self.draft, self.context)))) or None

    def covers(self, rows: int) -> bool:
        return rows <= MAX_ROWS and self.target.covers(rows)

    def covers_draft(self, ctx: DraftContext, k: int) -> bool:
        return self.draft.covers(k) and ctx is self.ctx and k + 1 <= MAX_ROWS and ctx.holds_block(k + 1)

    def covers_context(self, ctx: DraftContext, rows: int) -> bool:
        return self.context.covers(rows) and ctx is self.ctx and rows <= MAX_ROWS and ctx.holds_block(rows)

    def run(self, ids: torch.Tensor) -> ForwardOutput:
        """The forward of ids [m] at cache.length (not committed: the caller advances the cache)."""
        return self.target.run(self._forward, ids, ids.shape[0])

    def run_draft(self, anchor: torch.Tensor, k: int) -> torch.Tensor:
        """The drafter's logits [k, V] for the block after anchor [1], at the context's length."""
        return self.draft.run(self._draft, anchor, k)

    def write_context(self, taps: torch.Tensor) -> None:
        """Drafter.write_context of taps [rows, n*D] at the context's length (not held: the caller
        advances the context by the rows it keeps)."""
        self.context.run(self._write_context, taps, taps.shape[0])

    def _forward(self, ids: torch.Tensor, m: int) -> ForwardOutput:
        return self.model.compute(ids[:m], self.cache, self.taps, "all")

    def _draft(self, ids: torch.Tensor, k: int) -> torch.Tensor:
        drafter, ctx = self._drafting()
        return drafter.draft_logits(ctx, ids[:1], k)

    def _write_context(self, taps: torch.Tensor, rows: int) -> None:
        drafter, ctx = self._drafting()
        drafter.write_context(ctx, taps[:rows])

    def _drafting(self) -> tuple[Drafter, DraftContext]:
        if self.drafter is None or self.ctx is None:
            raise RuntimeError("these step graphs were made without a drafter and its context: no drafter steps")
        return self.drafter, self.ctx


def draft_logits(
    graphs: StepGraphs | None, drafter: Drafter, ctx: DraftContext, anchor: torch.Tensor, k: int
) -> torch.Tensor:
    """drafter.draft_logits(ctx, anchor, k), replayed from `graphs` where one of its graphs covers
    it (the same context, room for the block), else run eagerly: the decoder and the bench both draft so."""
    if graphs is not None and graphs.covers_draft(ctx, k):
        return graphs.run_draft(anchor, k)
    return drafter.draft_logits(ctx, anchor, k)
