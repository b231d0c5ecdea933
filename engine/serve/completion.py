"""OpenAI's chat completion objects from a job's events: the whole reply, or the stream's chunks.

Thoughts go to `reasoning_content` (as vLLM's reasoning parsers put them), the answer to `content`.
Usage is OpenAI's (prompt, completion and total tokens, `prompt_tokens_details.cached_tokens` for
the prefix reused from the previous request) plus `speculation`: the method the reply drafted with
(`method`: "dflash", "mtp" or "auto"; null when nothing drafts), what was drafted, what the target
accepted, and tau, the tokens per verify pass (null where nothing was drafted), in all and for each
method that drafted (`by_method`, empty when none did: with "auto" a reply may use both).
With `logprobs`, each choice has OpenAI's `logprobs: {"content": [...]}`, one entry per token of the
reply (thought, answer and the end-of-turn token alike, so they count `completion_tokens`); a stream
sends each step's entries with its text, or with an empty `content` when the text is held back.
"""

from __future__ import annotations

import json

from flashdesk.engine.serve.runner import JobDelta, MethodUsage, Usage

# "context": the context filled up; "time_limit": the server's time limit per request ended the reply
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length", "time_limit": "length"}
FINISH_REASONS["tool_calls"] = "tool_calls"  # the reply called tools (tool_reply.py)


def method_object(figures: MethodUsage) -> dict:
    return {
        "speculative_steps": figures.speculative_steps,
        "drafted": figures.drafted,
        "accepted": figures.accepted,
        "tau": figures.tau,
        "acceptance_rate": figures.acceptance_rate,
        "decode_tokens_per_second": figures.decode_tokens_per_second,
    }


def usage_object(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "speculation": {
            "method": usage.method,
            "speculative_steps": usage.speculative_steps,
            "drafted": usage.drafted,
            "accepted": usage.accepted,
            "tau": usage.tau,
            "acceptance_rate": usage.acceptance_rate,
            "decode_tokens_per_second": usage.decode_tokens_per_second,
            "by_method": {name: method_object(figures) for name, figures in usage.by_method.items()},
        },
    }


class Completion:
    """The objects of one request: `id`, `created` and `model` are the same in each."""

    def __init__(self, job_id: str, created: int, model: str, logprobs: bool = False):
        self.id, self.created, self.model, self.logprobs = job_id, created, model, logprobs

    def _logprobs(self, items) -> dict | None:
        return {"content": list(items), "refusal": None} if self.logprobs else None

    def whole(self, content: str, reasoning: str, reason: str, usage: Usage, logprobs=(), prompt_logprobs=None) -> dict:
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        choice = {"index": 0, "message": message, "logprobs": self._logprobs(logprobs)}
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{**choice, "finish_reason": FINISH_REASONS[reason]}],
            "usage": usage_object(usage),
        }

    def opening(self, with_usage: bool = False) -> str | None:
        """The stream's first chunk: the role."""
        return self.chunk({"role": "assistant", "content": ""}, with_usage=with_usage)

    def delta(self, item: JobDelta, with_usage: bool = False) -> str | None:
        """A step's chunk: its thought, its answer and their logprobs (None: nothing to send)."""
        delta = {"reasoning_content": item.reasoning} if item.reasoning else {}
        if item.content or (item.logprobs and not delta):
            delta["content"] = item.content
        if not delta:
            return None
        return self.chunk(delta, with_usage=with_usage, logprobs=item.logprobs)

    def closing(self, reason: str, with_usage: bool = False) -> str:
        """The chunk with the finish reason."""
        return self.chunk({}, reason, with_usage=with_usage)

    def chunk(self, delta: dict, reason: str | None = None, with_usage: bool = False, logprobs=None) -> str:
        """A stream chunk; with stream_options.include_usage every chunk has `usage: null` but the last."""
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": self._logprobs(logprobs) if logprobs else None,
                    "finish_reason": FINISH_REASONS[reason] if reason else None,
                }
            ],
        }
        if with_usage:
            body["usage"] = None
        return event(body)

    def usage_chunk(self, usage: Usage) -> str:
        """The stream's last chunk when usage was asked for: no choices, the usage."""
        return event(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_object(usage),
            }
        )


def event(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
