"""OpenAI's chat completion objects from a job's events: the whole reply, or the stream's chunks.

Thoughts go to `reasoning_content` (as vLLM's reasoning parsers put them), the answer to `content`.
Usage is OpenAI's (prompt, completion and total tokens, `prompt_tokens_details.cached_tokens` for
the prefix reused from the previous request) plus `speculation`: the method the reply drafted with
(`method`: "dflash", "mtp" or "auto"; null when nothing drafts), what was drafted, what the target
accepted, and tau, the tokens per verify pass (null where nothing was drafted), in all and for each
method that drafted (`by_method`, empty when none did: with "auto" a reply may use both).
"""

from __future__ import annotations

import json

from flashdesk.engine.serve.runner import MethodUsage, Usage

# "context": the context filled up; "time_limit": the server's time limit per request ended the reply
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length", "time_limit": "length"}


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

    def __init__(self, job_id: str, created: int, model: str):
        self.id, self.created, self.model = job_id, created, model

    def whole(self, content: str, reasoning: str, reason: str, usage: Usage) -> dict:
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": FINISH_REASONS[reason]}],
            "usage": usage_object(usage),
        }

    def chunk(self, delta: dict, reason: str | None = None, with_usage: bool = False) -> str:
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
                    "logprobs": None,
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
