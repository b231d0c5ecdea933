"""A reply streamed from a server, as the worker protocol's messages: Started, Steps, Finished.

Why the worker's messages: the chat controller, the reply, the store and the panels already know
them, so a remote reply goes through the same code as a local one. A server sends text, not token
ids or drafts, so each chunk becomes one step: its answer and thought text, its time since the
request was sent, and as many tokens as the chunk holds (the usage's count when the server sends
it on every chunk, else one a chunk: vLLM and SGLang stream one chunk per token, or per engine
step when they speculate). At the end the usage's completion_tokens corrects the count, so the
reply's tokens and tokens per second are the server's. Placeholder ids (-1) stand for the tokens.
Speculation figures come from the server's /metrics (server_metrics.py), handed in by the caller.
Qt-free.
"""

from __future__ import annotations

from flashdesk import protocol as p
from flashdesk.app.backends.openai_client import ChunkParts

UNKNOWN_ID = -1  # a token the server counted but did not name


class StreamSteps:
    def __init__(self, request_id: str, sent_at: float):
        self.request_id = request_id
        self.sent_at = sent_at  # time.monotonic() when the request was sent
        self.answer: list[str] = []
        self.thought: list[str] = []
        self.tokens = 0
        self.index = -1  # the last step's index
        self.first_elapsed: float | None = None
        self.last_elapsed: float | None = None
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def started(self) -> p.Started:
        """The server accepted the request (its prompt length comes with the usage, at the end)."""
        return p.Started(self.request_id, 0)

    def add(self, parts: ChunkParts, now: float, stats: dict | None = None) -> p.Step | None:
        """The step of a chunk; None for a chunk without text (the role, the end, the usage)."""
        if parts.usage:
            self.usage = parts.usage
        if parts.finish_reason:
            self.finish_reason = parts.finish_reason
        if not parts.content and not parts.reasoning:
            return None
        counted = _completion_tokens(parts.usage)
        emitted = counted - self.tokens if counted is not None and counted > self.tokens else 1
        return self._step(emitted, parts.content, parts.reasoning, now - self.sent_at, stats)

    def _step(self, emitted: int, answer: str, thought: str, elapsed: float, stats: dict | None) -> p.Step:
        self.index += 1
        self.tokens += emitted
        if answer:
            self.answer.append(answer)
        if thought:
            self.thought.append(thought)
        if self.first_elapsed is None:
            self.first_elapsed = elapsed
        self.last_elapsed = elapsed
        return p.Step(
            self.request_id,
            self.index,
            [UNKNOWN_ID] * emitted,
            [],
            0,
            answer,
            thought,
            seconds=elapsed if self.index == 0 else 0.0,
            elapsed=elapsed,
            stats=stats,
        )

    def finish(self, now: float, stats: dict | None, reason: str | None = None) -> list:
        """The messages that end the reply: a step with the tokens the usage counts beyond the chunks
        (at the time of the last chunk, so the speed is not diluted by the wait for the usage), then
        Finished. `reason` overrides the server's ("cancelled")."""
        messages: list = []
        counted = _completion_tokens(self.usage)
        if counted is not None and counted > self.tokens and self.last_elapsed is not None:
            messages.append(self._step(counted - self.tokens, "", "", self.last_elapsed, stats))
        end = dict(stats or {})
        prompt = int((self.usage or {}).get("prompt_tokens") or 0)
        cached = ((self.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None and prompt:  # the server said what it reused; else its prompt figures stay n/a
            end["reused_tokens"] = int(cached)
            end["prefill_tokens"] = prompt - int(cached)
        else:
            prompt = 0
        messages.append(
            p.Finished(
                self.request_id,
                reason or _reason(self.finish_reason),
                "".join(self.answer),
                "".join(self.thought),
                [],
                prompt,
                self.first_elapsed or 0.0,
                now - self.sent_at,
                end,
                max(self.index, 0),
            )
        )
        return messages


def _completion_tokens(usage: dict | None) -> int | None:
    value = (usage or {}).get("completion_tokens")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _reason(finish_reason: str | None) -> str:
    """The server's finish reason in the protocol's words (OpenAI's "stop" and "length" are ours)."""
    return finish_reason or "stop"
