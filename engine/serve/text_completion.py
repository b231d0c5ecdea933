"""OpenAI's text completion objects (POST /v1/completions) from a job's events: the whole reply, or chunks.

The same job events as chat (completion.py's Completion has the same methods, so app.py answers
both alike); here the text is one string, the model's thought channel (if the prompt opens one)
then its answer, and log probabilities take the legacy shape (logprobs.legacy). With `echo` the
prompt comes first: its text, and with `logprobs` its tokens' entries (the first one's logprob is
null), in the whole reply and in the stream's first chunk. `max_tokens: 0` runs the prompt and one
token that is not shown or counted: the reply is empty, and the prompt's figures are all there is.
`text_offset` counts the characters of the token strings before each token, from the start of the
choice's text.
"""

from __future__ import annotations

from dataclasses import replace

from flashdesk.engine.serve.completion import FINISH_REASONS, event, usage_object
from flashdesk.engine.serve.logprobs import legacy
from flashdesk.engine.serve.runner import JobDelta, Usage


class TextCompletion:
    """The objects of one request. `echo`: the prompt's text to put first (None: no echo);
    `logprobs`: whether they were asked for; `reply`: False for max_tokens 0."""

    def __init__(self, job_id: str, created: int, model: str, *, echo: str | None, logprobs: bool, reply: bool = True):
        self.id, self.created, self.model = job_id.replace("chatcmpl-", "cmpl-", 1), created, model
        self.echo, self.logprobs, self.reply = echo, logprobs, reply
        self._echo_pending = echo is not None  # the stream's first chunk carries it
        self._offset = 0  # characters of the token strings streamed so far (text_offset)

    def _texts(self, item: JobDelta) -> tuple[str, list[dict]]:
        """An event's text and logprob entries, the echoed prompt's first when it has not been sent."""
        text, items = "", []
        if self._echo_pending:
            self._echo_pending = False
            text = self.echo or ""
            items += list(item.prompt_logprobs or ())
        if self.reply:
            text += item.reasoning + item.content
            items += list(item.logprobs)
        return text, items

    def _choice(self, text: str, items: list[dict], reason: str | None, offset: int) -> dict:
        shown = legacy(items, offset) if self.logprobs else None
        return {
            "index": 0,
            "text": text,
            "logprobs": shown,
            "finish_reason": FINISH_REASONS[reason] if reason else None,
        }

    def _usage(self, usage: Usage) -> dict:
        return usage_object(usage if self.reply else replace(usage, completion_tokens=0))

    def whole(self, content: str, reasoning: str, reason: str, usage: Usage, logprobs=(), prompt_logprobs=None) -> dict:
        text, items = self._texts(JobDelta(content, reasoning, tuple(logprobs), prompt_logprobs))
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(text, items, reason, 0)],
            "usage": self._usage(usage),
        }

    def opening(self, with_usage: bool = False) -> str | None:
        return None  # no role to announce: the first chunk is the first text

    def delta(self, item: JobDelta, with_usage: bool = False) -> str | None:
        text, items = self._texts(item)
        if not text and not items:
            return None
        return self._chunk(text, items, None, with_usage)

    def closing(self, reason: str, with_usage: bool = False) -> str:
        text, items = self._texts(JobDelta("", ""))
        return self._chunk(text, items, reason, with_usage)

    def _chunk(self, text: str, items: list[dict], reason: str | None, with_usage: bool) -> str:
        choice = self._choice(text, items, reason, self._offset)
        self._offset += sum(len(i["token"]) for i in items)
        body = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if with_usage:
            body["usage"] = None
        return event(body)

    def usage_chunk(self, usage: Usage) -> str:
        return event(
            {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self._usage(usage),
            }
        )
