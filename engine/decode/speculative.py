"""The decode loop, one step at a time: plain autoregressive, or draft -> verify -> accept, the
drafts from DFlash's drafter (one pass for a block) or Gemma 4's MTP assistant (one step a token, mtp.py).

Speculation on or off and the draft length are read from a `SpecControl` at the start of every
step, so another thread can change them while a generation runs. Greedy output is the same either
way; with sampling the output distribution is the same (sampling.verify_draft).

A step never waits on the device until its one read: the tokens it emits, fetched by
`read_to_host` (which also carries the draft and the accepted count, for the statistics). The last
token stays on the device as the next step's input, acceptance is computed on the device, and step
times come from CUDA events read after that one read. On the Triton path (batch-invariant kernels)
the verified block's drafter context is written before that read too, for every row: the rows that
were not accepted are never held, and the next write overwrites them. A generation that asks for
logprobs (logprobs.py) reads them right after, once the device has finished the step. A step under a
grammar (grammar.py) reads its drafts before the verify, for the matcher on the host: greedy, all at
once (and a row again where the grammar refuses its choice); sampled, one by one.

A step is `launch`ed (its device work enqueued) and then `finish`ed (read); in between, the caller
can hand on the previous step's tokens while the device runs (Engine.generate does on a GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from flashdesk.engine.loading.memory_plan import PREFILL_CHUNK
from flashdesk.engine.model import cuda_graphs
from flashdesk.engine.model.drafter import DraftContext, Drafter
from flashdesk.engine.model.gemma4 import ForwardOutput, Gemma4
from flashdesk.engine.model.kv_cache import KVCache
from flashdesk.engine.decode.draft_length import AutoDraftLength, StepCosts
from flashdesk.engine.decode import guided_greedy
from flashdesk.engine.decode.grammar import GrammarError, GrammarState, Walk
from flashdesk.engine.decode.logprobs import TokenLogprob, logprob_rows, spec_chosen, unpack
from flashdesk.engine.decode.mtp import MtpDrafter, RoundState
from flashdesk.engine.decode.penalties import Penalties, wanted
from flashdesk.kernels.backend import fallbacks, use_triton
from flashdesk.protocol import AUTO_DRAFT_LENGTH
from flashdesk.engine.decode.sampling import (
    SamplingParams,
    draw,
    make_generator,
    probabilities,
    sample,
    suppressed,
    verify_draft,
)

PENDING_LIMIT = 256  # rows of target features that may wait for the drafter before being folded in
PROMPT_LOGPROB_ROWS = 256  # prompt rows per forward when their logprobs are asked (bounds the [rows, vocab] logits)


def read_to_host(t: torch.Tensor) -> list[Any]:
    """The one device-to-host read of a step (tests watch that nothing else reads): ids for a
    tensor of tokens, rows of floats for `logprob_rows`."""
    return t.tolist()


def _hidden(out: ForwardOutput) -> torch.Tensor:
    """A forward's final-norm rows, which the MTP assistant drafts from."""
    assert out.hidden is not None  # Gemma4.compute always returns the final norm's output
    return out.hidden


AUTO = AUTO_DRAFT_LENGTH  # SpecControl.draft_length: pick each step's draft length (draft_length.py)


@dataclass
class SpecControl:
    """Speculation settings a running generation picks up from its next step."""

    enabled: bool = True
    draft_length: int | str | None = None  # None: the method's default; AUTO: chosen per step
    # "dflash" or "mtp" (where that draft model is loaded), AUTO: each step the method and length
    # with the most expected tokens per second; None: the engine's default method
    method: str | None = None


@dataclass(frozen=True)
class StepResult:
    emitted: list[int]  # ids appended by this step (cut after an EOS, and at max tokens)
    draft: list[int]  # the drafted ids (empty for a plain step)
    accepted: int  # how many drafted ids agreed with the target
    draft_seconds: float
    verify_seconds: float  # the target's pass (a plain step is all verify)
    method: str | None = None  # which draft model drafted (None: a plain step)
    logprobs: list[TokenLogprob] | None = None  # one per emitted token, when the generation asks for them


class _StepClock:
    """Marks times inside a step without waiting for the device: CUDA events on a GPU (read once the
    step's tokens have arrived, so the wait is already over), the wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []  # CUDA events, or perf_counter seconds

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
    method: str | None = None  # the draft model that drafted (None: a plain step)
    round_state: RoundState | None = None  # MTP: what the next round drafted from before it (`abandon`)
    logprobs: torch.Tensor | None = None  # logprob_rows of its rows, when asked (read after `readback`)
    walk: Walk | None = None  # under a grammar: the matcher's path through the drafts (`finish` settles it)
    # greedy under a grammar: the target's rows (penalized, suppressed), verified on the host at `finish`
    guided_rows: torch.Tensor | None = None
    raw_logits: torch.Tensor | None = None  # and its own logits, for logprobs
    hidden: torch.Tensor | None = None  # and its hidden states, for an MTP assistant loaded beside


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
        auto: dict[str, AutoDraftLength] | AutoDraftLength | None = None,
        default_draft_length: int | str | None = None,
        mtp: MtpDrafter | None = None,
        default_method: str | None = None,
        logprobs: int | None = None,
        grammar: GrammarState | None = None,
    ):
        """`cache`, `ctx`: continue these from where they stand (a prefix cache placed them) instead
        of allocating new ones; `graphs`: a StepGraphs over them, which runs the decode, verify and
        draft passes as CUDA graphs; `mtp`: Gemma 4's MTP assistant, beside the drafter or alone;
        `auto`: each method's automatic draft length state (kept across generations by the
        engine); `default_method`: the method a control without one drafts with (None: DFlash
        where loaded); `default_draft_length`: what that method drafts when a control names no
        length (None: its own default); `logprobs`: each emitted token's log probability with that
        many alternatives (logprobs.py; None: none are computed); `grammar`: the request's matcher,
        whose mask every sampled position gets (grammar.py; a constrained step reads its drafts)."""
        self.model, self.drafter, self.mtp, self.sampling, self.eos = model, drafter, mtp, sampling, eos
        self.methods = {d.method: d for d in (drafter, mtp) if d is not None}
        slack = max(16, drafter.cfg.block_size) if drafter else 16
        if cache is None:
            cache = model.new_cache(max_context, kv_dtype, slack=slack)
        if ctx is None and drafter is not None:
            ctx = drafter.new_context(max_context)
        self.cache, self.ctx, self.graphs = cache, ctx, graphs
        if isinstance(auto, AutoDraftLength):  # one method's state
            auto = {next(iter(self.methods)): auto}
        auto = dict(auto or {})
        self.auto = {name: auto.get(name) or AutoDraftLength(d.max_draft_length) for name, d in self.methods.items()}
        self.default_method = default_method if default_method in self.methods else next(iter(self.methods), None)
        self.default_draft_length = default_draft_length
        self.taps = drafter.cfg.target_layer_ids if drafter else ()
        self.pending: list[torch.Tensor] = []  # target features not yet in the drafter's context
        # write a verified block's context before knowing how much of it is kept: a row's K/V must
        # not depend on how many rows are written with it (the Triton kernels' batch invariance)
        self.context_ahead = drafter is not None and use_triton(model.device) and not fallbacks()
        self.generator = make_generator(sampling, model.device)
        self.last: torch.Tensor | None = None  # [1]: sampled, not yet run through the target
        self.logprobs = logprobs
        self.grammar = grammar
        self.penalties: Penalties | None = None  # the sampling's penalties on used tokens (made at prefill)
        self.first_logprobs: list[TokenLogprob] | None = None  # the prefill's token's, when asked
        self.prompt_logprobs: list[TokenLogprob] | None = None  # prefill(prompt_logprobs=True)'s

    # What a path needs present, where it is known to be: DFlash's paths run only with the drafter
    # loaded (its context is made with it), MTP's with the assistant, and a step only after prefill.
    @property
    def _drafter(self) -> Drafter:
        assert self.drafter is not None  # a DFlash path: the drafter is loaded
        return self.drafter

    @property
    def _ctx(self) -> DraftContext:
        assert self.ctx is not None  # made with the drafter
        return self.ctx

    @property
    def _mtp(self) -> MtpDrafter:
        assert self.mtp is not None  # an MTP path: the assistant is loaded
        return self.mtp

    @property
    def _last(self) -> torch.Tensor:
        assert self.last is not None  # set by prefill
        return self.last

    def _forward(self, ids: torch.Tensor, rows: str) -> ForwardOutput:
        if self.graphs is not None and self.graphs.covers(ids.shape[0]):
            out = self.graphs.run(ids)  # the graph's own buffers: the next replay overwrites them
            self.cache.advance(ids.shape[0])
            return out
        return self.model.forward(ids, self.cache, taps=self.taps, logits_rows=rows)

    def prefill(self, prompt: list[int], start: int = 0, prompt_logprobs: bool = False) -> int:
        """Run prompt[start:] (the cache and the drafter context hold the first `start` positions)
        and sample the first token. The drafter's context is built chunk by chunk as the target goes,
        so no buffer grows with the prompt. `prompt_logprobs`: also each prompt token's log
        probability after the tokens before it (`self.prompt_logprobs`; the first has None), which
        takes every row's logits: the whole prompt runs, in chunks of PROMPT_LOGPROB_ROWS."""
        if self.cache.length != start or (self.ctx is not None and self.ctx.length != start):
            raise ValueError(f"prefill from position {start}, but the cache holds {self.cache.length} positions")
        if prompt_logprobs and start:
            raise ValueError("a prompt's logprobs need the whole prompt run: prefill it from position 0")
        ids = torch.tensor(prompt[start:], dtype=torch.long, device=self.model.device)
        chunk, top, rows = (PROMPT_LOGPROB_ROWS if prompt_logprobs else PREFILL_CHUNK), self.logprobs or 0, []
        for begin in range(0, len(ids), chunk):
            out = self._forward(ids[begin : begin + chunk], "all" if prompt_logprobs else "last")
            if out.taps is not None:
                self._drafter.add_context(self._ctx, out.taps)
            following = ids[begin + 1 : begin + 1 + chunk]  # the token each row is followed by
            if prompt_logprobs and len(following):
                rows.append(logprob_rows(out.logits[: len(following)], following, top))
        if self.mtp is not None:
            self.mtp.after_prefill(_hidden(out)[-1:].clone(), len(prompt))
        if wanted(self.sampling):
            self.penalties = Penalties(self.sampling, out.logits.shape[-1], self.model.device, prompt)
        self.last = self._pick(out.logits[-1:])
        first = read_to_host(self.last)[0]
        if self.penalties is not None:
            self.penalties.add([first])
        if self.grammar is not None:
            self.grammar.keep(first)
        if self.logprobs is not None:
            self.first_logprobs = unpack(read_to_host(logprob_rows(out.logits[-1:], self.last, top)), [first])
        if prompt_logprobs:
            rest = unpack(read_to_host(torch.cat(rows)), prompt[1:]) if rows else []
            self.prompt_logprobs = [TokenLogprob(prompt[0], None)] + rest  # nothing predicts the first
        return first

    def step(self, remaining: int, control: SpecControl | None) -> StepResult:
        """Produce at most `remaining` (>= 1) tokens after the last one."""
        return self.finish(self.launch(remaining, control))

    def launch(self, remaining: int, control: SpecControl | None) -> InFlight:
        """Enqueue a step's device work up to its one read; on a GPU this returns while the device
        runs, so the caller can hand on the previous step's tokens meanwhile. `finish` reads it;
        `abandon` undoes it when its tokens will not be wanted."""
        method, k, auto = self.plan(remaining, control)
        last, round_state = self.last, self.mtp.state if self.mtp else None
        if not k:
            flight = self._launch_plain()
        else:
            flight = self._launch_mtp(k) if method == "mtp" else self._launch_speculative(k)
        flight.k, flight.remaining, flight.last, flight.auto = k, remaining, last, auto
        flight.round_state, flight.method = round_state, method
        return flight

    def plan(self, remaining: int, control: SpecControl | None) -> tuple[str | None, int, bool]:
        """This step's (method, draft length, whether the automatic length chose it); k = 0 is a
        plain step. An automatic choice measures the method's step costs at its first use."""
        if not self.methods or (control is not None and not control.enabled):
            return None, 0, False
        default = self.default_method
        assert default is not None  # a draft model is loaded: the default is one
        method = control.method if control is not None and control.method else default
        if method not in self.methods and not (method == AUTO and len(self.methods) > 1):
            method = default  # a draft model not loaded, or no second one to choose
        wanted = control.draft_length if control is not None and control.draft_length else None
        if method == AUTO:
            wanted = AUTO
        elif wanted is None:
            own = self.default_draft_length if method == self.default_method else None
            wanted = own or self.methods[method].default_draft_length
        candidates = list(self.methods) if method == AUTO else [method]
        if wanted == AUTO:  # measure each candidate's step costs at its first use, where there is room
            for name in candidates:
                if self.auto[name].costs is None and self._room_to_measure(name):
                    self.auto[name].costs = self.measure_costs(name)
            measured = [name for name in candidates if self.auto[name].costs is not None]
            if measured:
                return (*self._fastest(measured, remaining), True)
            method = method if method != AUTO else default  # none measured yet: the default
            wanted = self.methods[method].default_draft_length
        assert isinstance(wanted, int)  # a length: AUTO was handled above
        k = max(0, min(wanted, self.methods[method].max_draft_length, self._limit(method, remaining)))
        return method, k, False

    def _fastest(self, methods: list[str], remaining: int) -> tuple[str, int]:
        """The method and draft length with the most expected tokens per second."""
        best = None
        for name in methods:
            chooser = self.auto[name]
            k = chooser.choose(self._limit(name, remaining))
            if best is None or chooser.rate(k) > best[0]:
                best = (chooser.rate(k), name, k)
        assert best is not None  # methods is not empty
        return best[1], best[2]

    def _room_to_measure(self, method: str) -> bool:
        """Whether the cache has room past its length for the calibration's longest verify pass."""
        return self.cache.max_context - self.cache.length >= self.methods[method].max_draft_length + 1

    def _limit(self, method: str, remaining: int) -> int:
        """The most drafts a step of `method` may make: the target's own token always comes out, so
        at most remaining - 1 drafts can; an MTP round drafts no more (as transformers' loop),
        DFlash drafts to `remaining` (as z-lab's loop)."""
        return remaining - 1 if method == "mtp" else remaining

    def finish(self, flight: InFlight) -> StepResult:
        """Read a launched step's tokens (the step's one device-to-host read) and keep what it verified."""
        values = read_to_host(flight.readback)
        clock, read_at = flight.clock, time.perf_counter()
        if flight.guided_rows is not None:
            values = self._verify_guided(flight, values)
        if flight.k == 0:
            if flight.taps is not None:
                self.pending.append(flight.taps.clone())  # a graph's buffer is overwritten by the next replay
            if self.grammar is not None:
                self.grammar.keep(values[0])
            if self.penalties is not None:
                self.penalties.add(values)
            verify = clock.seconds(0) + self._host_seconds(read_at)
            result = StepResult(values, [], 0, 0.0, verify, logprobs=self._read_logprobs(flight, values))
        else:
            *draft_ids, accepted, bonus = values
            if flight.walk is not None and flight.guided_rows is None:  # keep the accepted drafts, take the bonus
                assert self.grammar is not None  # a walk is the grammar's
                self.grammar.settle(flight.walk, accepted, bonus)
            emitted = (draft_ids[:accepted] + [bonus])[: flight.remaining]
            for i, token in enumerate(emitted):
                if token in self.eos:
                    emitted = emitted[: i + 1]
                    break
            self.cache.rollback(flight.start + len(emitted))  # keep the anchor and the accepted drafts
            if self.penalties is not None:
                self.penalties.add(emitted)
            if flight.ahead:
                self._ctx.advance(len(emitted))
            elif flight.taps is not None:  # a DFlash step verified on the torch path, or an MTP round
                self.pending.append(flight.taps[: len(emitted)].clone())
            result = StepResult(
                emitted,
                draft_ids,
                accepted,
                clock.seconds(0),
                clock.seconds(1) + self._host_seconds(read_at),
                flight.method,
                self._read_logprobs(flight, emitted),
            )
        if sum(rows.shape[0] for rows in self.pending) >= PENDING_LIMIT:  # DFlash unused for long
            self.flush_pending()
        if flight.auto:  # the method that drafted learns; every other forgets a little, to be retried
            for name, chooser in self.auto.items():
                if name == flight.method:
                    chooser.observe(flight.k, result.accepted, result.draft_seconds, result.verify_seconds)
                else:
                    chooser.forget()
        return result

    def _host_seconds(self, since: float) -> float:
        """The host's work on a step after its read, counted in its time where it is a grammar's
        (verifying on the host, settling the matcher): elsewhere it is a few bookkeeping calls."""
        return time.perf_counter() - since if self.grammar is not None else 0.0

    @staticmethod
    def _read_logprobs(flight: InFlight, emitted: list[int]) -> list[TokenLogprob] | None:
        """The step's logprobs, read after its tokens (the device has finished the step by then)."""
        if flight.logprobs is None:
            return None
        return unpack(read_to_host(flight.logprobs[: len(emitted)]), emitted)

    def abandon(self, flight: InFlight) -> None:
        """Undo a launched step that will not be finished: the cache and the next input go back to
        where they stood (the drafter's context was not advanced; what the step wrote past the held
        positions is overwritten later). An MTP round after it drafts from the same hidden state,
        over keys the undone verify rewrote: its drafts may differ from transformers', never the output."""
        self.cache.rollback(flight.start)
        self.last = flight.last
        if flight.walk is not None:
            flight.walk.undo()
        if self.mtp is not None:
            self.mtp.state = flight.round_state

    def measure_costs(self, method: str | None = None, repeats: int = 3) -> StepCosts:
        """Time a target pass over every block length 1..K+1 and a draft of every length 1..K by
        `method` (default: the default method), here, committing nothing (what they write past the
        held length, the next step overwrites). Each is run once first (a CUDA graph is captured, a
        kernel compiled), then timed `repeats` times."""
        method = method or self.default_method
        assert method is not None  # a draft model is loaded
        max_k = self.methods[method].max_draft_length
        self.flush_pending()
        start = self.cache.length
        ids = self._last.repeat(max_k + 1)

        def verify(m: int) -> None:
            self._forward(ids[:m], "all")
            self.cache.rollback(start)

        throwaway = make_generator(self.sampling, self.model.device)  # the generation's draws stay its own

        def draft(k: int) -> None:
            if method == "mtp":
                self._mtp.draft(self.cache, self._last, k, self.sampling, throwaway)
                return
            self._ctx.note_block(k + 1)
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
        out = self._forward(self._last, "last")
        if self.mtp is not None:  # the next MTP round drafts from this row
            self.mtp.after_forward(_hidden(out)[-1:].clone(), start, 1)
        self.last = self._pick(out.logits[-1:])
        clock.mark()
        flight = InFlight(start, self.last, clock, out.taps)
        if self.logprobs is not None:
            flight.logprobs = logprob_rows(out.logits[-1:], self.last, self.logprobs)
        return flight

    def flush_pending(self) -> None:
        """Turn the target features gathered since the last draft into the drafter's context K/V."""
        if self.pending:
            taps = torch.cat(self.pending)
            self._write_context(taps)
            self._ctx.advance(taps.shape[0])
            self.pending = []

    def _write_context(self, taps: torch.Tensor) -> None:
        """Drafter.write_context at the context's length, replayed from a CUDA graph where one covers it."""
        if self.graphs is not None and self.graphs.covers_context(self._ctx, taps.shape[0]):
            self.graphs.write_context(taps)
        else:
            self._drafter.write_context(self._ctx, taps)

    def _draft_logits(self, k: int) -> torch.Tensor:
        """Drafter.draft_logits after the last token, replayed from a CUDA graph where one covers it."""
        return cuda_graphs.draft_logits(self.graphs, self._drafter, self._ctx, self._last, k)

    def _launch_speculative(self, k: int) -> InFlight:
        clock = _StepClock(self.model.device)
        clock.mark()
        self.flush_pending()
        self._ctx.note_block(k + 1)
        draft_logits = self._draft_logits(k)
        walk = self.grammar.walk() if self.grammar is not None else None
        if walk is not None and self.sampling.greedy:
            return self._launch_guided_greedy(k, draft_logits, walk, clock)
        if walk is not None:  # row by row: each row masked with the state its drafts before it reach
            draft, draft_probs = self._guided_draft(draft_logits, walk)
        elif self.sampling.greedy:
            draft_probs, draft = None, draft_logits.argmax(dim=-1)
        else:
            draft_probs = probabilities(draft_logits, self.sampling)
            draft = draw(draft_probs, self.generator)
        clock.mark()
        start = self.cache.length
        out = self._forward(torch.cat([self._last, draft]), "all")
        taps = out.taps
        assert taps is not None  # the drafter's layers are tapped
        logits = self._target_rows(out.logits, draft, walk)
        accepted_t, bonus_t = verify_draft(draft, draft_probs, logits, self.sampling, self.generator)
        if self.mtp is not None:  # the next MTP round drafts from the accepted row
            self.mtp.after_forward(_hidden(out).index_select(0, accepted_t.view(1)), start, k + 1)
        ahead = self.context_ahead and self._ctx.holds_block(taps.shape[0])
        if ahead:  # before the read: the device goes on while the host waits
            self._write_context(taps)
        clock.mark()
        self.last = bonus_t.view(1)  # when the step is cut short, the generation ends there anyway
        readback = torch.cat([draft, accepted_t.view(1), bonus_t.view(1)])
        flight = InFlight(start, readback, clock, None if ahead else taps, ahead)
        flight.logprobs = self._verify_logprobs(out.logits, draft, accepted_t, bonus_t)
        flight.walk = walk
        return flight

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token [1] after a row of logits [1, V]: where a grammar forces one, that token (no
        mask computed, nothing drawn: it is what any sampling of the masked row gives); else sampled
        from the row with the penalties and under the mask."""
        forced = self.grammar.forced() if self.grammar is not None else None
        if forced is None:
            return sample(self._masked(logits), self.sampling, self.generator)
        if forced in self.sampling.suppress:  # the one allowed token is never emitted
            raise GrammarError(guided_greedy.NO_CHOICE)
        return torch.tensor([forced], dtype=torch.long).to(logits.device)

    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        """A row of logits [1, V] with the penalties and under the grammar's current mask (as it is without them)."""
        if self.penalties is not None:
            logits = self.penalties.apply(logits)
        return self.grammar.masked(logits) if self.grammar is not None else logits

    def _target_rows(self, logits: torch.Tensor, draft: torch.Tensor, walk: Walk | None) -> torch.Tensor:
        """A verify pass's rows [k + 1, V], each as plain decoding would have sampled it after the
        drafts before it: penalized counting them, masked with the grammar's state after them."""
        if self.penalties is not None:
            logits = self.penalties.apply(logits, draft)
        return walk.target(logits) if walk is not None else logits

    def _guided_draft(self, draft_logits: torch.Tensor, walk: Walk) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled DFlash drafts [k] and their distributions [k, V] under a grammar, row by row, each
        row masked with the grammar's state after the drafts before it."""
        tokens, probs = [], []
        for row in draft_logits.split(1):
            p = probabilities(walk.masked(row), self.sampling)
            token = draw(p, self.generator)
            walk.take(token)
            tokens.append(token)
            probs.append(p)
        return torch.cat(tokens), torch.cat(probs)

    def _launch_guided_greedy(self, k: int, draft_logits: torch.Tensor, walk: Walk, clock: _StepClock) -> InFlight:
        """A greedy DFlash step under a grammar: one read for its drafts, masks computed only for the
        rows the verification reaches, and applied only where a choice falls outside them.

        A row's masked argmax is its plain argmax whenever the row's mask allows that token. The
        drafter's few likeliest tokens a row are read at once (its rows do not depend on the drafts
        before them) and walked through the matcher (`guided_greedy.draft_tokens`); the target's argmaxes
        come back with the step's read and are checked on the host against each row's rule, as far
        as the drafts are accepted (`_verify_guided`). Where the grammar forces a token (a JSON key,
        a separator) no mask is computed at all: the row's choice is that token; nor where it
        forces no byte and the matcher takes the target's choice (`guided_greedy.row_choice`)."""
        top = min(guided_greedy.DRAFT_CANDIDATES, draft_logits.shape[-1])
        candidates = read_to_host(draft_logits.topk(top, dim=-1).indices)
        draft = torch.tensor(guided_greedy.draft_tokens(candidates, draft_logits, walk), dtype=torch.long)
        draft = draft.to(draft_logits.device)
        clock.mark()
        start = self.cache.length
        out = self._forward(torch.cat([self._last, draft]), "all")
        rows = self.penalties.apply(out.logits, draft) if self.penalties is not None else out.logits
        rows = suppressed(rows, self.sampling)
        taps = out.taps
        assert taps is not None  # the drafter's layers are tapped
        ahead = self.context_ahead and self._ctx.holds_block(taps.shape[0])
        if ahead:
            self._write_context(taps)
        clock.mark()
        readback = torch.cat([draft, rows.argmax(dim=-1)])
        flight = InFlight(start, readback, clock, None if ahead else taps, ahead)
        flight.walk, flight.guided_rows, flight.raw_logits = walk, rows, out.logits
        flight.hidden = out.hidden if self.mtp is not None else None
        return flight

    def _verify_guided(self, flight: InFlight, values: list[int]) -> list[int]:
        """Greedy verification under a grammar, on the host: the drafts while each equals the
        target's masked argmax at its row, then that argmax (the bonus), as plain decoding would
        pick them. The matcher goes back to the step's start and takes each kept token in turn, so
        a row's rule is its state's, as the walk found it where it got there (`guided_greedy.row_choice`).
        Returns drafts + [accepted, bonus] (a plain verify's read) and sets the next step's input,
        as the device does for the other steps."""
        k, walk, rows = flight.k, flight.walk, flight.guided_rows
        assert walk is not None and rows is not None
        draft_ids, best = values[:k], values[k:]
        state = walk.state
        state.rollback(walk.consumed)
        accepted = 0
        for i in range(k + 1):
            emitted = i < flight.remaining  # a row past them (all k = remaining drafts kept) is never emitted
            row = rows[i : i + 1]
            token = guided_greedy.row_choice(walk, i, draft_ids, best[i], row, self.sampling.suppress, emitted)
            if emitted:
                state.keep(token)  # the accepted draft, or the bonus
            if not (i < walk.consumed and token == draft_ids[i]):
                break
            accepted += 1
        device = self.model.device
        self.last = torch.tensor([token], dtype=torch.long).to(device)
        if self.mtp is not None:  # the next MTP round drafts from the accepted row
            assert flight.hidden is not None
            self.mtp.after_forward(flight.hidden[accepted : accepted + 1].clone(), flight.start, k + 1)
        if self.logprobs is not None:
            chosen = torch.tensor(draft_ids[:accepted] + [token], dtype=torch.long).to(device)
            assert flight.raw_logits is not None
            flight.logprobs = logprob_rows(flight.raw_logits[: accepted + 1], chosen, self.logprobs)
        return draft_ids + [accepted, token]

    def _launch_mtp(self, k: int) -> InFlight:
        """An MTP round: k assistant steps, then the target's verify forward, which also gives the
        hidden state the next round drafts from (the accepted row's, picked on the device)."""
        clock = _StepClock(self.model.device)
        clock.mark()
        walk = self.grammar.walk() if self.grammar is not None else None
        mtp, last = self._mtp, self._last
        draft, draft_probs = mtp.draft(self.cache, last, k, self.sampling, self.generator, walk)
        clock.mark()
        start = self.cache.length
        out = self._forward(torch.cat([last, draft]), "all")
        logits = self._target_rows(out.logits, draft, walk)
        accepted_t, bonus_t = verify_draft(draft, draft_probs, logits, self.sampling, self.generator)
        mtp.after_forward(_hidden(out).index_select(0, accepted_t.view(1)), start, k + 1)
        clock.mark()
        self.last = bonus_t.view(1)
        readback = torch.cat([draft, accepted_t.view(1), bonus_t.view(1)])
        flight = InFlight(start, readback, clock, out.taps)  # with a drafter loaded too: its context's rows
        flight.logprobs = self._verify_logprobs(out.logits, draft, accepted_t, bonus_t)
        flight.walk = walk
        return flight

    def _verify_logprobs(self, logits, draft, accepted, bonus) -> torch.Tensor | None:
        """The emitted tokens' rows of a verify pass, when logprobs are asked: the target's own
        logits at each position, as a plain step there would have computed them."""
        if self.logprobs is None:
            return None
        return logprob_rows(logits, spec_chosen(draft, accepted, bonus), self.logprobs)
