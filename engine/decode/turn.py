"""One chat turn on the engine: messages -> a prompt fitted to the context -> step events with running
statistics -> how it ended.

Why shared: the worker (the app's chats) and the HTTP server (`flashdesk serve`) run the same turns
on the same engine, and must fit the context, count the reused prefix, keep the speculation
statistics and stop between steps in exactly the same way. Each adds only its own transport.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Callable

from flashdesk.engine.decode.conversation import DROP_OLDEST, FittedPrompt, fit_conversation
from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest, StepEvent
from flashdesk.engine.decode.grammar import Grammar
from flashdesk.engine.decode.prefix_cache import LOCAL
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.stats import SpecStats, StepRecord

CANCELLED = "cancelled"


@dataclass(frozen=True)
class TurnStep:
    """One engine step of the turn, with the turn's statistics so far (None for the prefill)."""

    event: StepEvent
    elapsed: float  # seconds since the turn started, when the step ended
    stats: dict | None


@dataclass(frozen=True)
class TurnEnd:
    """How the turn ended: "stop", "length", "context" (the reply filled the context) or "cancelled"."""

    reason: str
    text: str
    thought: str
    token_ids: list[int]
    elapsed: float
    stats: dict  # the turn's summary (the engine's own when it finished, with kernels and reuse)
    last_step: int  # the index of the last step run


class ChatTurn:
    """A conversation fitted to the engine's context (raises ContextOverflowError when it cannot be),
    ready to run. `prompt`, `reused` and `fitted` say what will run before anything does.

    `fitted`: a prompt already built (the API server tokenizes on its own threads, so the engine's
    thread never waits on a long prompt's tokenizing); `scope`: whose prefixes it may reuse
    (prefix_cache.py); `logprobs`, `prompt_logprobs`, `grammar`, `stop_ids`: as GenerationRequest's (the
    prompt's logprobs need the whole prompt run, so nothing is reused)."""

    def __init__(
        self,
        engine,
        messages: list[dict],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        thinking: bool = False,
        ignore_eos: bool = False,
        stop: tuple[str, ...] = (),
        policy: str = DROP_OLDEST,
        reuse: bool = True,
        fitted: FittedPrompt | None = None,
        scope: str = LOCAL,
        logprobs: int | None = None,
        prompt_logprobs: bool = False,
        grammar: Grammar | None = None,
        stop_ids: tuple[int, ...] = (),
    ):
        self.engine = engine
        self.fitted = fitted or fit_conversation(
            engine.tokenizer,
            messages,
            thinking=thinking,
            context_limit=engine.context_limit,
            max_new_tokens=max_tokens,
            policy=policy,
        )
        self.prompt = self.fitted.ids
        reuse = reuse and not prompt_logprobs
        self.request = GenerationRequest(
            self.prompt,
            self.fitted.max_new_tokens,
            sampling,
            ignore_eos,
            tuple(stop),
            reuse=reuse,
            scope=scope,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            grammar=grammar,
            stop_ids=stop_ids,
        )
        self.reused = engine.reusable_tokens(self.prompt, scope) if reuse else 0
        self.stats = SpecStats()
        self.prefill = 0.0  # seconds of the prefill step, once it ran

    def summary(self, engine_stats: dict | None = None) -> dict:
        """The turn's statistics: the engine's own when it finished (kernels, CUDA graphs, reuse),
        else the count of the steps run and the reuse that was expected."""
        return {
            **self.stats.summary(),
            "prompt_tokens": len(self.prompt),
            "prefill_seconds": self.prefill,
            "reused_tokens": self.reused,
            "prefill_tokens": len(self.prompt) - self.reused,
            "dropped_messages": self.fitted.dropped,
            "cut_chars": self.fitted.cut_chars,
            "max_tokens": self.fitted.max_new_tokens,
            **(engine_stats or {}),
        }

    def run(
        self, control=None, should_stop: Callable[[], bool] = lambda: False
    ) -> Generator[TurnStep | TurnEnd, None, None]:
        """Yield a TurnStep per engine step, then one TurnEnd. `should_stop` is asked after each step
        (once its consumer has handled it): True ends the turn there as "cancelled", and the engine
        keeps what it computed for the next turn's prefix."""
        started = time.perf_counter()
        tokens: list[int] = []
        answer: list[str] = []
        thought: list[str] = []
        index = 0
        events = self.engine.generate(self.request, control)
        try:
            for event in events:
                if isinstance(event, FinishEvent):
                    reason = self.fitted.finish_reason(event.finish_reason, len(event.token_ids))
                    yield TurnEnd(
                        reason,
                        event.text,
                        event.thought,
                        event.token_ids,
                        time.perf_counter() - started,
                        self.summary(event.stats),
                        index,
                    )
                    return
                index = event.index
                if index == 0:
                    self.prefill = event.seconds
                else:
                    self.stats.add(
                        StepRecord(
                            tuple(event.draft),
                            event.accepted,
                            tuple(event.emitted),
                            event.draft_seconds,
                            event.verify_seconds,
                            event.method,
                        )
                    )
                tokens += event.emitted
                answer.append(event.answer)
                thought.append(event.thought)
                yield TurnStep(event, time.perf_counter() - started, self.stats.summary() if index else None)
                if should_stop():
                    yield TurnEnd(
                        CANCELLED,
                        "".join(answer),
                        "".join(thought),
                        tokens,
                        time.perf_counter() - started,
                        self.summary(),
                        index,
                    )
                    return
        finally:
            events.close()
