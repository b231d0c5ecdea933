"""A reply that may hold tool calls, in OpenAI's shape: the answer's text cut from its calls, each call
with an id, its name and its arguments as JSON text; `finish_reason` "tool_calls" when it called.

Whole replies carry `message.tool_calls` (and `content` null when there is no text). Streams send a
call's first delta with its index, id, type and name as soon as the name is written, then its
arguments as JSON fragments, as OpenAI streams them; the client joins the fragments of each index.
It wraps the request's Completion (completion.py), which writes every object.

The reply's text comes marked (the job's `marks`, tool_calls.py): only the model's real control tokens
open and close calls and their strings, so `<tool_call|>` typed inside an argument, or a call's
characters in plain text, stay text. A call whose arguments are not a JSON object (malformed, cut
short, or holding NaN or Infinity) is left out of a whole reply; a stream has sent it as it came.
"""

from __future__ import annotations

import uuid
from typing import Any

from flashdesk.engine.decode.tool_calls import CallSplitter, Piece, complete
from flashdesk.engine.serve.completion import Completion
from flashdesk.engine.serve.runner import JobDelta, Usage


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolReply:
    """Completion's objects for a reply read for tool calls (other attributes are the Completion's)."""

    def __init__(self, completion: Completion):
        self.inner = completion
        self.splitter = CallSplitter(marked=True)
        self.ids: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def whole(self, content: str, reasoning: str, reason: str, usage: Usage, *more: Any) -> dict:
        text = self.splitter.push(content).text + self.splitter.finish().text
        calls = [call for call in self.splitter.calls if complete(call)]
        reply = self.inner.whole(text, reasoning, reason, usage, *more)
        if calls:
            choice = reply["choices"][0]
            choice["message"]["content"] = text or None
            choice["message"]["tool_calls"] = [
                {"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
            if reason == "stop":
                choice["finish_reason"] = "tool_calls"
        return reply

    def delta(self, item: JobDelta, with_usage: bool = False) -> str | None:
        piece = self.splitter.push(item.content)
        delta: dict[str, Any] = {"reasoning_content": item.reasoning} if item.reasoning else {}
        if piece.text:
            delta["content"] = piece.text
        calls = self._calls(piece)
        if calls:
            delta["tool_calls"] = calls
        if not delta and not getattr(item, "logprobs", None):
            return None
        if not delta:
            delta["content"] = ""
        return self.inner.chunk(delta, with_usage=with_usage, logprobs=getattr(item, "logprobs", None))

    def _calls(self, piece: Piece) -> list[dict]:
        """One entry per call the piece touched: its start (id, type, name) and its argument fragments."""
        entries: dict[int, dict] = {}
        for index, name in piece.started:
            self.ids.append(call_id())
            entries[index] = {
                "index": index,
                "id": self.ids[index],
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        for index, fragment in piece.arguments:
            entry = entries.setdefault(index, {"index": index, "function": {"arguments": ""}})
            entry["function"]["arguments"] += fragment
        return [entries[i] for i in sorted(entries)]

    def closing(self, reason: str, with_usage: bool = False) -> str:
        tail = self.splitter.finish().text
        out = self.inner.chunk({"content": tail}, with_usage=with_usage) if tail else ""
        if self.splitter.calls and reason == "stop":
            reason = "tool_calls"
        return out + self.inner.chunk({}, reason, with_usage=with_usage)
