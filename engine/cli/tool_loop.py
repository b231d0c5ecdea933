"""The tool loop of `flashdesk chat --tools`: what each round asks of the engine, and the model's calls.

Calls are read by token, as `serve` reads them: the engine says where each control token's text
begins (StepEvent.controls), and only those open and close a call.

A user message may take several rounds: the model calls tools, their results go back, and it goes
on until it answers in text. `--tool-choice` shapes the first round of each message exactly as
`serve` shapes a request (tools.py there): `none` never lets the call token out, `auto` stops at
`<|tool_response>` where a call waits for its result, and `required` or a tool's name forces a valid
call with the grammar built from the tools' parameters. Later rounds are `auto`, as an agent loop's
are; after MAX_ROUNDS rounds the model must answer without tools, so a message cannot loop forever.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from flashdesk.engine.cli.tool_files import Tool
from flashdesk.engine.decode.grammar import Grammar, check, lark
from flashdesk.engine.decode.tool_calls import CallSplitter, Markers, call_grammar, complete
from flashdesk.engine.errors import FlashDeskError

MAX_ROUNDS = 8  # rounds of calls per user message; then one answer without tools
CHOICES = ("auto", "none", "required")
DECLINED = "the user declined to run this call"


def check_choice(choice: str, names: list[str]) -> str:
    """--tool-choice: auto, none, required or one of the tools' names."""
    if choice not in CHOICES and choice not in names:
        raise ValueError(f"--tool-choice is auto, none, required or a tool's name ({', '.join(names)}), got {choice!r}")
    return choice


@dataclass(frozen=True)
class Shape:
    """What one round's generation is held to (GenerationRequest's grammar and stop_ids, sampling's suppress)."""

    grammar: Grammar | None = None
    stop_ids: tuple[int, ...] = ()
    suppress: tuple[int, ...] = ()


@dataclass
class ToolCall:
    """One call the model made. The front end decides: `run()` or `decline()`; either sets `result`,
    the text that goes back to the model."""

    name: str
    arguments: dict
    tool: Tool | None  # None: the model named a tool that does not exist
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    result: str | None = None
    status: str = "pending"  # then "ran", "declined" or "failed" (no such tool)

    def shown(self) -> str:
        return f"{self.name}({json.dumps(self.arguments, ensure_ascii=False)})"

    def run(self) -> str:
        if self.tool is None:
            self.status, self.result = "failed", f"error: there is no tool named {self.name!r}"
        else:
            self.status, self.result = "ran", self.tool.run(self.arguments)
        return self.result

    def decline(self) -> str:
        self.status, self.result = "declined", DECLINED
        return self.result

    def message(self) -> dict:
        """The tool message that carries the result back (a call nobody decided on counts as declined)."""
        return {"role": "tool", "tool_call_id": self.id, "name": self.name, "content": self.result or DECLINED}

    def record(self) -> dict:
        return {"name": self.name, "arguments": self.arguments, "status": self.status, "result": self.result}


class ToolBox:
    """The session's tools over one model's tokenizer: declarations, each round's shape, calls read back."""

    def __init__(self, tools: list[Tool], tokenizer: Any, choice: str = "auto"):
        self.tools = {tool.name: tool for tool in tools}
        self.declared = [tool.declaration() for tool in tools]
        self.choice = check_choice(choice, list(self.tools))
        try:
            self.markers = Markers.of(tokenizer)
        except ValueError as exc:
            raise FlashDeskError(str(exc)) from None
        self._grammars: dict[tuple[str, bool], Grammar] = {}
        self.shape("required", thinking=False)  # a parameter schema no grammar can hold is refused now

    def round_choice(self, index: int) -> str:
        """The tool choice of a message's round `index` (0 first)."""
        if index == 0:
            return self.choice
        return "auto" if index < MAX_ROUNDS else "none"

    def shape(self, choice: str, thinking: bool) -> Shape:
        m = self.markers
        if choice == "none":
            return Shape(suppress=(m.call_open,))
        if choice == "auto":
            return Shape(stop_ids=(m.response_open,))
        key = (choice, thinking)
        if key not in self._grammars:
            forced = [t.declaration()["function"] for t in self.tools.values() if choice in ("required", t.name)]
            grammar = lark(call_grammar(forced, m, parallel=choice == "required", thinking=thinking))
            why = check(grammar)
            if why:
                raise FlashDeskError(f"the tools' parameters cannot be enforced: {why.strip()}"[:500])
            self._grammars[key] = grammar
        return Shape(self._grammars[key], stop_ids=(m.response_open,))

    def read(self, marked: str) -> tuple[str, list[ToolCall], bool]:
        """A reply's text without its calls, its whole calls, and whether it ended inside one. `marked`:
        the reply with its control tokens marked (tool_calls.with_marks), so a model that spells
        `<|tool_call>` out in characters writes text, not a call."""
        splitter = CallSplitter(marked=True)
        content = splitter.push(marked).text + splitter.finish().text
        calls = [
            ToolCall(call.name, json.loads(call.arguments), self.tools.get(call.name))
            for call in splitter.calls
            if complete(call)
        ]
        return content, calls, len(calls) < len(splitter.calls)


def assistant_message(content: str, calls: list[ToolCall]) -> dict:
    """The reply as the history keeps it: the chat template writes its calls in Gemma 4's format."""
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message
