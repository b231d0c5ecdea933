"""What a chat request's `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` ask of the
engine: the tools to declare in the prompt, a grammar for the reply, tokens never to emit and tokens
that end the reply. Each malformed or impossible ask is a 400 naming its field.

- `response_format` json_object / json_schema: the answer is JSON (matching the schema), by grammar.
- `tool_choice` "auto" (the default with tools): the model may answer or call; it stops at
  `<|tool_response>`, where a call waits for its result, and with `parallel_tool_calls` false at the
  `<tool_call|>` that closes its first call (so at most one comes out, and nothing is generated only to
  be thrown away). "none": the tools are still declared (the conversation may hold earlier calls), and
  `<|tool_call>` is never emitted. "required" or a named function: a grammar built from the tools'
  parameters forces one call (more with `parallel_tool_calls`), so a valid call comes out whatever the model.
- Earlier calls (`tool_calls` of assistant messages, their `arguments` JSON text) and `tool` messages
  are handed to the chat template, which writes them in Gemma 4's format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flashdesk.engine.decode.grammar import Grammar, check, json_grammar, lark
from flashdesk.engine.decode.tool_calls import Markers, call_grammar, not_json
from flashdesk.engine.serve.errors import ApiError
from flashdesk.engine.serve.schema import ChatCompletionRequest

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name


@dataclass(frozen=True)
class Plan:
    tools: list[dict] | None = None  # declared in the prompt (OpenAI's tool objects)
    grammar: Grammar | None = None
    suppress: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] = ()
    calls: bool = False  # the reply may hold tool calls: read them back (from a marked reply: the Job's `marks`)


def _bad(param: str, text: str) -> ApiError:
    return ApiError(400, text, param)


MAX_TOOLS = 128
MAX_PROPERTIES = 256  # of one object in a tool's parameters: the call grammar nests a rule per property
MAX_DEPTH = 16  # of nested schemas in a tool's parameters


def _bounded(schema: Any, where: str, depth: int = 0, limit: int = MAX_DEPTH) -> None:
    """Refuse a schema too big for a grammar: deep or wide schemas build grammars whose checking can
    exhaust the stack of the process that serves everyone."""
    if depth > limit:
        raise _bad(where, f"the schema nests more than {limit} levels deep")
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict) and len(props) > MAX_PROPERTIES:
            raise _bad(where, f"an object in a tool's parameters has {len(props)} properties: at most {MAX_PROPERTIES}")
        for value in schema.values():
            _bounded(value, where, depth + 1, limit)
    elif isinstance(schema, list):
        for value in schema:
            _bounded(value, where, depth + 1, limit)


def functions(tools: Any) -> list[dict]:
    """The request's tools' function objects, checked: a name each (unique), parameters an object
    schema of bounded size."""
    if not isinstance(tools, list):
        raise _bad("tools", 'tools must be a list of {"type": "function", "function": {...}} objects')
    if len(tools) > MAX_TOOLS:
        raise _bad("tools", f"{len(tools)} tools: at most {MAX_TOOLS}")
    found = []
    for i, tool in enumerate(tools):
        f = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(f, dict):
            raise _bad(f"tools[{i}]", f'tools[{i}] must be {{"type": "function", "function": {{"name", ...}}}}')
        if not isinstance(f.get("name"), str) or not NAME.match(f["name"]):
            raise _bad(f"tools[{i}].function.name", "a function's name is 1 to 64 letters, digits, _ or -")
        params = f.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise _bad(f"tools[{i}].function.parameters", "a function's parameters must be a JSON schema of an object")
        if not isinstance(f.get("description", ""), str):
            raise _bad(f"tools[{i}].function.description", "a function's description must be text")
        _bounded(params, f"tools[{i}].function.parameters")
        found.append(f)
    names = [f["name"] for f in found]
    if len(set(names)) != len(names):
        raise _bad("tools", "two tools have the same name")
    return found


def _choice(choice: Any, names: list[str]) -> str | None:
    """The choice: "none", "auto", "required", or the name of the function it forces."""
    if choice is None:
        return "auto" if names else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not names:
            raise _bad("tool_choice", 'tool_choice "required" needs tools')
        return "auto" if choice == "auto" and not names else choice
    f = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        shape = '{"type": "function", "function": {"name"}}'
        raise _bad("tool_choice", f'tool_choice is "none", "auto", "required" or {shape}')
    if f["name"] not in names:
        raise _bad("tool_choice", f"tool_choice names {f['name']!r}, which is not one of the tools")
    return f["name"]


def _response_grammar(response_format: Any, thought: tuple[int, int] | None) -> Grammar | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(None, thought)
    if kind != "json_schema":
        raise _bad("response_format", 'response_format type is "text", "json_object" or "json_schema"')
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _bad("response_format", 'a json_schema response_format needs "json_schema": {"name", "schema"}')
    schema = spec.get("schema", {})
    if not isinstance(schema, dict) or not isinstance(spec.get("strict", False), (bool, type(None))):
        raise _bad("response_format", "json_schema.schema must be a JSON schema object, strict true or false")
    _bounded(schema, "response_format", limit=2 * MAX_DEPTH)
    grammar = json_grammar(schema or None, thought)
    why = check(grammar)
    if why:
        raise _bad("response_format", f"the schema cannot be enforced: {why.strip()}"[:500])
    return grammar


class Structure:
    """Plans for one model's tokenizer (its tool and channel control tokens, looked up once)."""

    def __init__(self, tokenizer: Any):
        try:
            self.markers: Markers | None = Markers.of(tokenizer)
        except ValueError:
            self.markers = None

    def plan(self, body: ChatCompletionRequest) -> Plan:
        """The plan for a ChatCompletionRequest (schema.py), or a 400."""
        m = self.markers
        thought = (m.channel_open, m.channel_close) if m is not None and body.thinking else None
        grammar = _response_grammar(body.response_format, thought)
        tools = functions(body.tools) if body.tools else []
        if body.ignore_eos and (grammar is not None or tools):
            shaped = "ignore_eos cannot go with a response_format or tools: a shaped reply ends with its shape"
            raise _bad("ignore_eos", shaped)
        choice = _choice(body.tool_choice, [f["name"] for f in tools])
        if m is None:
            if tools or choice != "none":
                raise _bad("tools", "this model's tokenizer has no tool-call tokens: it cannot call tools")
            return Plan(None, grammar)
        declared = [{"type": "function", "function": f} for f in tools] or None
        if choice == "none":
            return Plan(declared, grammar, (m.call_open,) if tools else ())
        if choice == "auto":
            one = (m.call_close,) if body.parallel_tool_calls is False else ()  # the first call ends the reply
            return Plan(declared, grammar, stop_ids=(m.response_open, *one), calls=grammar is None)
        if grammar is not None:
            raise _bad("response_format", "a JSON response_format and a forced tool call cannot both shape the reply")
        forced = tools if choice == "required" else [f for f in tools if f["name"] == choice]
        parallel = body.parallel_tool_calls is not False and choice == "required"
        grammar = lark(call_grammar(forced, m, parallel=parallel, thinking=body.thinking))
        why = check(grammar)
        if why:
            raise _bad("tools", f"the tools' parameters cannot be enforced: {why.strip()}"[:500])
        return Plan(declared, grammar, stop_ids=(m.response_open,), calls=True)


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as the chat template takes them: each earlier call's `arguments` (JSON text in
    OpenAI's messages) as an object, which the template writes in Gemma 4's syntax."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls:
            parsed = []
            for j, call in enumerate(calls):
                f = call.get("function") if isinstance(call, dict) else None
                where = f"messages[{i}].tool_calls[{j}]"
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    shape = '{"id", "type": "function", "function": {"name", "arguments"}}'
                    raise _bad(where, f"{where} must be {shape}")
                if not NAME.match(f["name"]):
                    raise _bad(f"{where}.function.name", "a function's name is 1 to 64 letters, digits, _ or -")
                try:  # NaN and Infinity, which Python's json reads, are not JSON
                    arguments = json.loads(f.get("arguments") or "{}", parse_constant=not_json)
                except (TypeError, ValueError):
                    raise _bad(f"{where}.function.arguments", "a call's arguments must be JSON text") from None
                if not isinstance(arguments, dict):
                    raise _bad(f"{where}.function.arguments", "a call's arguments must be a JSON object")
                parsed.append({"id": call.get("id"), "type": "function", "function": {**f, "arguments": arguments}})
            message = {**message, "tool_calls": parsed}
        out.append(message)
    return out
