"""The decode loop, one step at a time: plain autoregressive, or DFlash draft -> verify -> accept.

Speculation on or off and the draft length are read from a `SpecControl` at the start of every
step, so another thread can change them while a generation runs. Greedy output is the same either
way; with sampling the output distribution is the same (sampling.verify_draft).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from flashdesk.engine.drafter import Drafter
from flashdesk.engine.gemma4 import Gemma4
from flashdesk.engine.sampling import SamplingParams, draw, make_generator, probabilities, sample, verify_draft

PREFILL_CHUNK = 1024  # prompt tokens per forward: bounds activation memory on long prompts
PENDING_LIMIT = 256  # plain steps whose target features wait for the drafter before being folded in


@dataclass
class SpecControl:
    """Speculation settings a running generation picks up from its next step."""

    enabled: bool = True
    draft_length: int | None = None  # None: the drafter's block_size - 1


@dataclass(frozen=True)
class StepResult:
    emitted: list[int]  # ids appended by this step (cut after an EOS, and at max tokens)
    draft: list[int]  # the drafted ids (empty for a plain step)
    accepted: int  # how many drafted ids agreed with the target
    draft_seconds: float
    verify_seconds: float  # the target's pass (a plain step is all verify)


class Decoder:
    """The state of one generation: target KV cache, drafter context, the token still to be run."""

    def __init__(self, model: Gemma4, drafter: Drafter | None, max_context: int, kv_dtype: str,
                 sampling: SamplingParams, eos: set[int]):
        self.model, self.drafter, self.sampling, self.eos = model, drafter, sampling, eos
        slack = max(16, drafter.cfg.block_size) if drafter else 16
        self.cache = model.new_cache(max_context, kv_dtype, slack=slack)
        self.ctx = drafter.new_context(max_context) if drafter else None
        self.taps = drafter.cfg.target_layer_ids if drafter else ()
        self.pending: list[torch.Tensor] = []  # target features not yet in the drafter's context
        self.generator = make_generator(sampling, model.device)
        self.last: int | None = None  # sampled, not yet run through the target

    def _now(self) -> float:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        return time.perf_counter()

    def _forward(self, ids: list[int], rows: str):
        out = self.model.forward(torch.tensor(ids, dtype=torch.long, device=self.model.device), self.cache,
                                 taps=self.taps, logits_rows=rows)
        return out.logits, out.taps

    def prefill(self, prompt: list[int]) -> int:
        for begin in range(0, len(prompt), PREFILL_CHUNK):
            logits, taps = self._forward(prompt[begin:begin + PREFILL_CHUNK], "last")
            if taps is not None:
                self.pending.append(taps)
        self.last = int(sample(logits[-1], self.sampling, self.generator))
        return self.last

    def step(self, remaining: int, control: SpecControl | None) -> StepResult:
        """Produce at most `remaining` (>= 1) tokens after the last one."""
        k = 0
        if self.drafter is not None and (control is None or control.enabled):
            wanted = control.draft_length if control and control.draft_length else self.drafter.max_draft_length
            k = max(0, min(wanted, self.drafter.max_draft_length, remaining))
        if k == 0:
            t0 = self._now()
            logits, taps = self._forward([self.last], "last")
            if taps is not None:
                self.pending.append(taps)
                if len(self.pending) >= PENDING_LIMIT:  # speculation off for long: keep memory bounded
                    self._flush_pending()
            self.last = int(sample(logits[-1], self.sampling, self.generator))
            return StepResult([self.last], [], 0, 0.0, self._now() - t0)
        return self._speculative_step(k, remaining)

    def _flush_pending(self) -> None:
        """Turn the target features gathered since the last draft into the drafter's context K/V."""
        if self.pending:
            self.drafter.add_context(self.ctx, torch.cat(self.pending))
            self.pending = []

    def _speculative_step(self, k: int, remaining: int) -> StepResult:
        t0 = self._now()
        self._flush_pending()
        draft_logits = self.drafter.draft_logits(self.ctx, self.last, k)
        if self.sampling.greedy:
            draft_probs, draft = None, draft_logits.argmax(dim=-1)
        else:
            draft_probs = probabilities(draft_logits, self.sampling)
            draft = draw(draft_probs, self.generator)
        draft_ids = draft.tolist()
        t1 = self._now()
        start = self.cache.length
        logits, taps = self._forward([self.last] + draft_ids, "all")
        accepted, bonus = verify_draft(draft, draft_probs, logits, self.sampling, self.generator)
        emitted = (draft_ids[:accepted] + [bonus])[:remaining]
        for i, token in enumerate(emitted):
            if token in self.eos:
                emitted = emitted[:i + 1]
                break
        self.cache.rollback(start + len(emitted))  # keep the anchor and the accepted drafts
        self.pending.append(taps[:len(emitted)])
        self.last = emitted[-1]
        return StepResult(emitted, draft_ids, accepted, t1 - t0, self._now() - t1)
