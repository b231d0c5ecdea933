"""The decode loop, one step at a time: plain autoregressive, or DFlash draft -> verify -> accept.

Speculation on or off and the draft length are read from a `SpecControl` at the start of every
step, so another thread can change them while a generation runs. Greedy output is the same either
way; with sampling the output distribution is the same (sampling.verify_draft).

A step never waits on the device until its one read: the tokens it emits, fetched by
`read_to_host` (which also carries the draft and the accepted count, for the statistics). The last
token stays on the device as the next step's input, acceptance is computed on the device, and step
times come from CUDA events read after that one read. On the Triton path (batch-invariant kernels)
the verified block's drafter context is written before that read too, for every row: the rows that
were not accepted are never held, and the next write overwrites them.

A step is `launch`ed (its device work enqueued) and then `finish`ed (read); in between, the caller
can hand on the previous step's tokens while the device runs (Engine.generate does on a GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from flashdesk.engine.loading.memory_plan import PREFILL_CHUNK
from flashdesk.engine.model import cuda_graphs
from flashdesk.engine.model.drafter import DraftContext, Drafter
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.model.kv_cache import KVCache
from flashdesk.engine.decode.draft_length import AutoDraftLength, StepCosts
from flashdesk.kernels.backend import fallbacks, use_triton
from flashdesk.protocol import AUTO_DRAFT_LENGTH
from flashdesk.engine.decode.sampling import SamplingParams, draw, make_generator, probabilities, sample, verify_draft

PENDING_LIMIT = 256  # plain steps whose target features wait for the drafter before being folded in


def read_to_host(t: torch.Tensor) -> list[int]:
    """The one device-to-host read of a step (tests watch that nothing else reads)."""
    return t.tolist()


AUTO = AUTO_DRAFT_LENGTH  # SpecControl.draft_length: pick each step's draft length (draft_length.py)


@dataclass
class SpecControl:
    """Speculation settings a running generation picks up from its next step."""

    enabled: bool = True
    draft_length: int | str | None = None  # None: the drafter's block_size - 1; AUTO: chosen per step


@dataclass(frozen=True)
class StepResult:
    emitted: list[int]  # ids appended by this step (cut after an EOS, and at max tokens)
    draft: list[int]  # the drafted ids (empty for a plain step)
    accepted: int  # how many drafted ids agreed with the target
    draft_seconds: float
    verify_seconds: float  # the target's pass (a plain step is all verify)


class _StepClock:
    """Marks times inside a step without waiting for the device: CUDA events on a GPU (read once the
    step's tokens have arrived, so the wait is already over), the wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self, i: int) -> float:
        """Time from mark i to mark i + 1 (call after the step's read)."""
        a, b = self.marks[i], self.marks[i + 1]
        return a.elapsed_time(b) / 1000 if self.cuda else b - a


@dataclass
class InFlight:
    """A launched step: its device work is enqueued, its tokens are not read yet."""

    start: int  # the cache's length before the step
    readback: torch.Tensor  # what its one read fetches: the token, or the drafts, accepted count and bonus
    clock: _StepClock
    taps: torch.Tensor | None  # target features for the drafter's context, unless written ahead
    ahead: bool = False  # the block's drafter context was written before the read
    k: int = 0  # drafts
    remaining: int = 0  # the most tokens it may emit
    last: torch.Tensor | None = None  # its input token (`abandon` restores it)
    auto: bool = False  # the automatic draft length chose k (`finish` tells it the outcome)


def _seconds(device: torch.device, fn, arg: int, repeats: int) -> float:
    """Mean seconds of fn(arg) after one untimed run (a calibration: it may wait for the device)."""
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn(arg)
    wait()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(arg)
    wait()
    return (time.perf_counter() - t0) / repeats


class Decoder:
    """The state of one generation: target KV cache, drafter context, the token still to be run."""

    def __init__(
        self,
        model: Gemma4,
        drafter: Drafter | None,
        max_context: int,
        kv_dtype: str,
        sampling: SamplingParams,
        eos: set[int],
        cache: KVCache | None = None,
        ctx: DraftContext | None = None,
        graphs=None,
        auto: AutoDraftLength | None = None,
        default_draft_length: int | str | None = None,
    ):
        """`cache`, `ctx`: continue these from where they stand (a prefix cache placed them) instead
        of allocating new ones; `graphs`: a StepGraphs over them, which runs the decode, verify and
        draft passes as CUDA graphs; `auto`: the automatic draft length's state (kept across
        generations by the engine); `default_draft_length`: what a control without a length drafts
        (None: the drafter's longest)."""
        self.model, self.drafter, self.sampling, self.eos = model, drafter, sampling, eos
        slack = max(16, drafter.cfg.block_size) if drafter else 16
        if cache is None:
            cache = model.new_cache(max_context, kv_dtype, slack=slack)
        if ctx is None and drafter is not None:
            ctx = drafter.new_context(max_context)
        self.cache, self.ctx, self.graphs = cache, ctx, graphs
        self.auto = auto if auto is not None or drafter is None else AutoDraftLength(drafter.max_draft_length)
        self.default_draft_length = default_draft_length or (drafter.max_draft_length if drafter else 0)
        self.taps = drafter.cfg.target_layer_ids if drafter else ()
        self.pending: list[torch.Tensor] = []  # target features not yet in the drafter's context
        # write a verified block's context before knowing how much of it is kept: a row's K/V must
        # not depend on how many rows are written with it (the Triton kernels' batch invariance)
        self.context_ahead = drafter is not None and use_triton(model.device) and not fallbacks()
        self.generator = make_generator(sampling, model.device)
        self.last: torch.Tensor | None = None  # [1]: sampled, not yet run through the target

    def _forward(self, ids: torch.Tensor, rows: str):
        if self.graphs is not None and self.graphs.covers(ids.shape[0]):
            out = self.graphs.run(ids)  # the graph's own buffers: the next replay overwrites them
            self.cache.advance(ids.shape[0])
            return out.logits, out.taps
        out = self.model.forward(ids, self.cache, taps=self.taps, logits_rows=rows)
        return out.logits, out.taps

    def prefill(self, prompt: list[int], start: int = 0) -> int:
        """Run prompt[start:] (the cache and the drafter context hold the first `start` positions)
        and sample the first token. The drafter's context is built chunk by chunk as the target goes,
        so no buffer grows with the prompt."""
        if self.cache.length != start or (self.ctx is not None and self.ctx.length != start):
            raise ValueError(f"prefill from position {start}, but the cache holds {self.cache.length} positions")
        ids = torch.tensor(prompt[start:], dtype=torch.long, device=self.model.device)
        for begin in range(0, len(ids), PREFILL_CHUNK):
            logits, taps = self._forward(ids[begin : begin + PREFILL_CHUNK], "last")
            if taps is not None:
                self.drafter.add_context(self.ctx, taps)
        self.last = sample(logits[-1:], self.sampling, self.generator)
        return read_to_host(self.last)[0]

    def step(self, remaining: int, control: SpecControl | None) -> StepResult:
        """Produce at most `remaining` (>= 1) tokens after the last one."""
        return self.finish(self.launch(remaining, control))

    def launch(self, remaining: int, control: SpecControl | None) -> InFlight:
        """Enqueue a step's device work up to its one read; on a GPU this returns while the device
        runs, so the caller can hand on the previous step's tokens meanwhile. `finish` reads it;
        `abandon` undoes it when its tokens will not be wanted."""
        k, auto = 0, False
        if self.drafter is not None and (control is None or control.enabled):
            wanted = control.draft_length if control and control.draft_length else self.default_draft_length
            if wanted == AUTO:
                if self.auto.costs is None:
                    self.auto.costs = self.measure_costs()
                k, auto = self.auto.choose(remaining), True
            else:
                k = max(0, min(wanted, self.drafter.max_draft_length, remaining))
        last = self.last
        flight = self._launch_speculative(k) if k else self._launch_plain()
        flight.k, flight.remaining, flight.last, flight.auto = k, remaining, last, auto
        return flight

    def finish(self, flight: InFlight) -> StepResult:
        """Read a launched step's tokens (the step's one device-to-host read) and keep what it verified."""
        values = read_to_host(flight.readback)
        clock = flight.clock
        if flight.k == 0:
            if flight.taps is not None:
                self.pending.append(flight.taps.clone())  # a graph's buffer is overwritten by the next replay
                if len(self.pending) >= PENDING_LIMIT:  # speculation off for long: keep memory bounded
                    self.flush_pending()
            result = StepResult(values, [], 0, 0.0, clock.seconds(0))
        else:
            *draft_ids, accepted, bonus = values
            emitted = (draft_ids[:accepted] + [bonus])[: flight.remaining]
            for i, token in enumerate(emitted):
                if token in self.eos:
                    emitted = emitted[: i + 1]
                    break
            self.cache.rollback(flight.start + len(emitted))  # keep the anchor and the accepted drafts
            if flight.ahead:
                self.ctx.advance(len(emitted))
            else:
                self.pending.append(flight.taps[: len(emitted)].clone())
            result = StepResult(emitted, draft_ids, accepted, clock.seconds(0), clock.seconds(1))
        if flight.auto:
            self.auto.observe(flight.k, result.accepted, result.draft_seconds, result.verify_seconds)
        return result

    def abandon(self, flight: InFlight) -> None:
        """Undo a launched step that will not be finished: the cache and the next input go back to
        where they stood (the drafter's context was not advanced; what the step wrote past the held
        positions is overwritten later)."""
        self.cache.rollback(flight.start)
        self.last = flight.last

    def measure_costs(self, repeats: int = 3) -> StepCosts:
        """Time a target pass over every block length 1..K+1 and a draft of every length 1..K, here,
        committing nothing (what they write past the held length, the next step overwrites). Each is
        run once first (a CUDA graph is captured, a kernel compiled), then timed `repeats` times."""
        max_k = self.drafter.max_draft_length
        self.flush_pending()
        start = self.cache.length
        ids = self.last.repeat(max_k + 1)

        def verify(m: int) -> None:
            self._forward(ids[:m], "all")
            self.cache.rollback(start)

        def draft(k: int) -> None:
            self.ctx.note_block(k + 1)
            self._draft_logits(k)

        timed = lambda fn, n: _seconds(self.model.device, fn, n, repeats)  # noqa: E731
        return StepCosts(
            [0.0] + [timed(draft, k) for k in range(1, max_k + 1)],
            [0.0] + [timed(verify, m) for m in range(1, max_k + 2)],
        )

    def _launch_plain(self) -> InFlight:
        clock = _StepClock(self.model.device)
        start = self.cache.length
        clock.mark()
        logits, taps = self._forward(self.last, "last")
        self.last = sample(logits[-1:], self.sampling, self.generator)
        clock.mark()
        return InFlight(start, self.last, clock, taps)

    def flush_pending(self) -> None:
        """Turn the target features gathered since the last draft into the drafter's context K/V."""
        if self.pending:
            taps = torch.cat(self.pending)
            self._write_context(taps)
            self.ctx.advance(taps.shape[0])
            self.pending = []

    def _write_context(self, taps: torch.Tensor) -> None:
        """Drafter.write_context at the context's length, replayed from a CUDA graph where one covers it."""
        if self.graphs is not None and self.graphs.covers_context(self.ctx, taps.shape[0]):
            self.graphs.write_context(taps)
        else:
            self.drafter.write_context(self.ctx, taps)

    def _draft_logits(self, k: int) -> torch.Tensor:
        """Drafter.draft_logits after the last token, replayed from a CUDA graph where one covers it."""
        return cuda_graphs.draft_logits(self.graphs, self.drafter, self.ctx, self.last, k)

    def _launch_speculative(self, k: int) -> InFlight:
        clock = _StepClock(self.model.device)
        clock.mark()
        self.flush_pending()
        self.ctx.note_block(k + 1)
        draft_logits = self._draft_logits(k)
        if self.sampling.greedy:
            draft_probs, draft = None, draft_logits.argmax(dim=-1)
        else:
            draft_probs = probabilities(draft_logits, self.sampling)
            draft = draw(draft_probs, self.generator)
        clock.mark()
        start = self.cache.length
        logits, taps = self._forward(torch.cat([self.last, draft]), "all")
        accepted_t, bonus_t = verify_draft(draft, draft_probs, logits, self.sampling, self.generator)
        ahead = self.context_ahead and self.ctx.holds_block(taps.shape[0])
        if ahead:  # before the read: the device goes on while the host waits
            self._write_context(taps)
        clock.mark()
        self.last = bonus_t.view(1)  # when the step is cut short, the generation ends there anyway
        readback = torch.cat([draft, accepted_t.view(1), bonus_t.view(1)])
        return InFlight(start, readback, clock, None if ahead else taps, ahead)
