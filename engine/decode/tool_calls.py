"""Gemma 4's tool calls: the grammar that forces a valid call, and the model's calls read back as JSON.

Gemma 4 writes a call as `<|tool_call>call:NAME{key:value,...}<tool_call|>` and then `<|tool_response>`,
where it waits for the result. Its argument syntax is not JSON: keys are bare, strings are enclosed in
the `<|"|>` control token (so they need no escapes), and objects and lists nest as in JSON; the chat
template writes earlier calls the same way, keys in sorted order. The grammar here follows a tool's
JSON-schema parameters in that syntax, with the control tokens as tokens (a model cannot spell them
out in characters), so a forced call always parses and fits its parameters. `ArgsToJson` turns the
syntax into JSON text as it streams, which is what OpenAI's `arguments` carry; `CallSplitter` cuts a
streamed answer into its text and its calls.

Reading calls back by token, not by characters: a model can spell `<tool_call|>` or `<|"|>` out in
ordinary tokens (inside a string argument, or in plain text), and the detokenized text of those is the
same as the control token's. So a reply read for calls is *marked*: the engine says where each control
token's text begins (generation.StepEvent.controls), `with_marks` puts MARK there, and a marked reader
(`CallSplitter(marked=True)`) takes only MARK and a marker's text for the token; the characters alone
stay text. Unmarked reading (the default) takes the characters for the token, for text whose tokens
are not known.

Torch-free: the HTTP side builds grammars and reads replies; the engine only applies the grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import llguidance

CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, QUOTE = "<|tool_call>", "<tool_call|>", "<|tool_response>", '<|"|>'
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
WORD = r"/[A-Za-z_][A-Za-z0-9_]*/"
# Put before a control token's text in a marked reply: a lone surrogate, which no decoded text holds
# (tokenizers decode to valid Unicode), so a model can never write it.
MARK = "\udfff"
NON_FINITE = ("NaN", "Infinity", "-Infinity")  # Python's json reads them; they are not JSON


@dataclass(frozen=True)
class Markers:
    """The control tokens' ids in this tokenizer (looked up, never assumed)."""

    call_open: int
    call_close: int
    response_open: int
    quote: int
    channel_open: int
    channel_close: int

    @classmethod
    def of(cls, tokenizer: Any) -> "Markers":
        ids = []
        for text in (CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, QUOTE, CHANNEL_OPEN, CHANNEL_CLOSE):
            tid = tokenizer.convert_tokens_to_ids(text)
            if not isinstance(tid, int) or tid == tokenizer.unk_token_id:
                raise ValueError(f"this model's tokenizer has no {text} token: it cannot call tools")
            ids.append(tid)
        return cls(*ids)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# keys beside a `$ref` that constrain nothing
ANNOTATIONS = ("description", "title", "examples", "default", "$comment", "deprecated")
# a number's bounds in JSON Schema, which llguidance's JSON grammar (`%json` in Lark) enforces
NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _branches(pattern: str) -> list[str]:
    """A regex's top-level alternatives (its `|` outside groups and classes, escapes skipped)."""
    out, depth, in_class, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    return out + [pattern[start:]]


def _anchored_end(branch: str) -> bool:
    """Whether a branch ends with a `$` anchor (not an escaped dollar: an even run of backslashes before it)."""
    if not branch.endswith("$"):
        return False
    slashes = len(branch[:-1]) - len(branch[:-1].rstrip("\\"))
    return slashes % 2 == 0


def whole_match(pattern: str) -> str | None:
    """A JSON Schema `pattern` (ECMA semantics: it matches anywhere in the string unless anchored,
    `\\d` and `\\w` are ASCII) as a Lark regex over the whole string, each top-level alternative
    anchored on its own; None where llguidance cannot compile it (a lookaround, an inner anchor)."""
    parts = []
    for branch in _branches(pattern):
        starts, ends = branch.startswith("^"), _anchored_end(branch)
        body = branch[1 if starts else 0 : len(branch) - 1 if ends else len(branch)]
        body = llguidance.regex_to_lark(body, "dw") if body else ""
        parts.append(("" if starts else "(?s:.*)") + f"(?:{body})" + ("" if ends else "(?s:.*)"))
    regex = "(?:" + "|".join(parts) + ")"
    ok = not llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(f"start: /{regex}/\n"))
    return regex if ok else None


class _Rules:
    """Lark rules for Gemma's argument syntax, one per schema node, named in order."""

    def __init__(self, markers: Markers):
        self.q = f"<[{markers.quote}]>"
        self.lines: list[str] = []
        self.count = 0
        self.generic: str | None = None
        self.root: dict = {}  # the parameters schema whose local `$ref`s are being followed
        self.following: list[str] = []  # the constrained `$ref`s being inlined (one met again: any value there)
        self.refs: dict[str, str] = {}  # each plain `$ref`'s rule

    def add(self, body: str) -> str:
        name = f"r{self.count}"
        self.count += 1
        self.lines.append(f"{name}: {body}")
        return name

    def add_recursive(self, body: Callable[[str], str]) -> str:
        """A rule whose body may name the rule itself: named first, its body written then."""
        at = len(self.lines)
        name = self.add("PLACEHOLDER")
        self.lines[at] = f"{name}: {body(name)}"
        return name

    def string(self, enum: list | None = None, schema: dict | None = None) -> str:
        if enum:
            return f"{self.q} ({' | '.join(_literal(str(v)) for v in enum)}) {self.q}"
        pattern = (schema or {}).get("pattern")
        regex = whole_match(pattern) if isinstance(pattern, str) else None
        if regex is not None:
            return f"{self.q} /{regex}/ {self.q}"
        low, high = (schema or {}).get("minLength"), (schema or {}).get("maxLength")
        if isinstance(low, int) or isinstance(high, int):
            bounds = f"{low if isinstance(low, int) else 0},{high if isinstance(high, int) else ''}"
            return f"{self.q} /(?s:.{{{bounds}}})/ {self.q}"
        return f"{self.q} /(?s:.*)/ {self.q}"

    def any_value(self) -> str:
        """A value of any kind (a schema that says nothing, or what this grammar does not follow)."""
        if self.generic is None:

            def body(name: str) -> str:
                pair = f'{WORD} ":" {name}'
                array = f'"[" ({name} ("," {name})*)? "]"'
                obj = f'"{{" ({pair} ("," {pair})*)? "}}"'
                return f'{self.string()} | NUMBER | "true" | "false" | "null" | {array} | {obj}'

            self.generic = self.add_recursive(body)
        return self.generic

    def value(self, schema: Any) -> str:
        if not isinstance(schema, dict) or not schema:
            return self.any_value()
        if isinstance(schema.get("$ref"), str):
            return self._ref(schema)
        if "const" in schema:
            return self._scalar(schema["const"])
        if "enum" in schema:
            return self.add(" | ".join(self._scalar(v) for v in schema["enum"]) or self.any_value())
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.add(" | ".join(self.value(s) for s in schema[key]))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.add(" | ".join(self.value({**schema, "type": k}) for k in kind) or self.any_value())
        bounded = {key: schema[key] for key in NUMBER_BOUNDS if _is_number(schema.get(key))}
        body = {
            "string": lambda: self.string(schema=schema),
            "integer": lambda: f"%json {json.dumps({'type': 'integer', **bounded})}" if bounded else "INTEGER",
            "number": lambda: f"%json {json.dumps({'type': 'number', **bounded})}" if bounded else "NUMBER",
            "boolean": lambda: '"true" | "false"',
            "null": lambda: '"null"',
            "array": lambda: self._array(schema),
            "object": lambda: self.object(schema),
        }.get(kind if isinstance(kind, str) else "")
        if body is None:
            return self.any_value()
        if schema.get("nullable"):
            return self.add(f'{body()} | "null"')
        return self.add(body())

    def resolved(self, schema: dict) -> dict:
        """`schema` with a local `$ref` (`#`, `#/$defs/...`, any JSON pointer into the parameters)
        followed, the keys beside it kept; {} where it does not resolve."""
        ref = schema.get("$ref")
        if not isinstance(ref, str):
            return schema
        target: Any = self.root if ref == "#" or ref.startswith("#/") else None
        for part in ref[2:].split("/") if ref.startswith("#/") else []:
            key = part.replace("~1", "/").replace("~0", "~")
            target = target.get(key) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            return {}
        return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}

    def _ref(self, schema: dict) -> str:
        """A local `$ref`: one named rule per reference (so a recursive one recurses in the grammar,
        and one used many times is written once); one with constraints beside it, inlined."""
        ref = schema["$ref"]
        beside = {k for k in schema if k not in ("$ref", *ANNOTATIONS)}
        if beside:
            if ref in self.following:  # recursive and constrained: not followed further
                return self.any_value()
            self.following.append(ref)
            try:
                return self.value(self.resolved(schema))
            finally:
                self.following.pop()
        if ref not in self.refs:

            def body(name: str) -> str:
                self.refs[ref] = name  # the target may refer to it
                return self.value(self.resolved({"$ref": ref}))

            self.add_recursive(body)
        return self.refs[ref]

    def _scalar(self, value: Any) -> str:
        if isinstance(value, str):
            return self.string([value])
        return _literal(json.dumps(value))  # true, false, null, a number: as written

    def _array(self, schema: dict) -> str:
        item = self.value(schema.get("items"))
        return f'"[" ({item} ("," {item})*)? "]"'

    def object(self, schema: dict) -> str:
        """`{key:value,...}` with the schema's properties in sorted order (as the template writes
        them), the required ones always and the others optional; free keys when none are named."""
        props = schema.get("properties")
        if not isinstance(props, dict):
            return self.value_of_free_object()
        required = set(schema.get("required") or ())
        order = sorted(props, key=str.lower)  # as the template's dictsort writes them: case-insensitive
        items = [(f'{_literal(key)} ":" {self.value(props[key])}', key in required) for key in order]
        return f'"{{" {self._sequence(items)} "}}"'

    def value_of_free_object(self) -> str:
        generic = self.any_value()
        pair = f'{WORD} ":" {generic}'
        return f'"{{" ({pair} ("," {pair})*)? "}}"'

    def _sequence(self, items: list[tuple[str, bool]]) -> str:
        """Items in order, a comma between those present; `(text, required)` each. Built from the
        last: `rest` writes the items from i on after one already written (each with its comma),
        `first` the same with nothing written yet (no comma before the first present one)."""
        rest = first = None
        for text, needed in reversed(items):
            after = f" {rest}" if rest else ""
            own_rest, own_first = f'"," {text}{after}', f"{text}{after}"
            if needed:
                rest, first = self.add(own_rest), self.add(own_first)
            else:
                rest, first = (
                    self.add(f"({own_rest}) | {rest}" if rest else f"({own_rest})?"),
                    self.add(f"({own_first}) | {first}" if first else f"({own_first})?"),
                )
        return first or ""


def call_grammar(tools: list[dict], markers: Markers, *, parallel: bool = True, thinking: bool = False) -> str:
    """A Lark grammar for one call (or, `parallel`, one or more) of `tools` (OpenAI's function
    objects: name, parameters), each `<|tool_call>call:NAME{args}<tool_call|>`, then `<|tool_response>`;
    with `thinking`, a thought may come first."""
    rules = _Rules(markers)
    calls = []
    for tool in tools:
        parameters = tool.get("parameters")
        rules.root = parameters if isinstance(parameters, dict) and parameters else {"type": "object", "properties": {}}
        rules.refs = {}  # a reference is to its own tool's parameters
        args = rules.object(rules.resolved(rules.root))
        calls.append(f'"call:" {_literal(tool["name"])} {args}')
    call = rules.add(f"<[{markers.call_open}]> ({' | '.join(calls)}) <[{markers.call_close}]>")
    start = f"{call}+" if parallel else call
    head = "thought? " if thinking else ""
    lines = [f"start: {head}{start} <[{markers.response_open}]>"]
    if thinking:
        lines.append(f"thought: <[{markers.channel_open}]> /(?s:.*)/ <[{markers.channel_close}]>")
    lines += rules.lines
    lines += [r"INTEGER: /-?(0|[1-9][0-9]*)/", r"NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"]
    return "\n".join(lines) + "\n"


# -- reading calls back ------------------------------------------------------------------------------------


def with_marks(text: str, controls: Sequence[int]) -> str:
    """`text` with MARK before each control token's text, `controls` being where those begin in it
    (generation.StepEvent.controls): a reply as a marked reader takes it."""
    if not controls:
        return text
    out, last = [], 0
    for at in sorted(controls):
        out += [text[last:at], MARK]
        last = at
    out.append(text[last:])
    return "".join(out)


class _Lexer:
    """Streamed text cut into plain text and control tokens (each one of `names`), as (text, is_control)
    parts. Marked: a control token is MARK and its name, and any other MARK is dropped (another control
    token's text is text here); unmarked: a name's characters anywhere are the token. A control token's
    text cut across pushes is held until it is whole."""

    def __init__(self, names: tuple[str, ...], marked: bool):
        self.names, self.marked = names, marked
        self.held = ""

    def push(self, text: str) -> list[tuple[str, bool]]:
        buf, self.held = self.held + text, ""
        parts: list[tuple[str, bool]] = []
        i = 0
        while i < len(buf):
            at, name = self._find(buf, i)
            if at < 0:
                keep = 0 if self.marked else max(_partial_tail(buf, n, i) for n in self.names)
                parts.append((buf[i : len(buf) - keep], False))
                self.held = buf[len(buf) - keep :]
                break
            parts.append((buf[i:at], False))
            if name is None:  # a marked token cut short: wait for the rest
                self.held = buf[at:]
                break
            if name:
                parts.append((name, True))
            i = at + len(name) + (1 if self.marked else 0)
        return [(part, control) for part, control in parts if part]

    def _find(self, buf: str, start: int) -> tuple[int, str | None]:
        """The next control token from `start`: (where, its name); (where, "") at the mark of another
        control token (its text is text); (where, None) where a marked one may be cut short; (-1, None)
        when there is none."""
        if not self.marked:
            found = [(at, name) for name in self.names if (at := buf.find(name, start)) >= 0]
            return min(found) if found else (-1, None)
        at = buf.find(MARK, start)
        if at < 0:
            return -1, None
        for name in self.names:
            if buf.startswith(name, at + 1):
                return at, name
        left = len(buf) - at - 1  # a name longer than what is left may yet come whole
        return at, None if any(left < len(name) and name.startswith(buf[at + 1 :]) for name in self.names) else ""

    def finish(self) -> str:
        """What is held, as text: a marker's start at the very end was only text after all."""
        held, self.held = self.held.replace(MARK, ""), ""
        return held


class ArgsToJson:
    """Gemma's argument syntax, streamed in, as JSON text streamed out: `push(text)` returns the JSON
    its text completes (a marker split across pushes, or a bare word, is held until it is whole);
    `done` once the outermost object has closed. `marked`: strings open and close only at a marked
    `<|"|>` (module docstring). `text` and `quote` take the parts of a call CallSplitter has cut."""

    def __init__(self, marked: bool = False):
        self.stack: list[str] = []  # "{" (its next token is a key) / ":" (a value) / "["
        self.lexer = _Lexer((QUOTE,), marked)
        self.in_string = False
        self.word = ""  # a bare key or scalar being read
        self.done = False

    def push(self, text: str) -> str:
        return "".join(self.quote() if control else self.text(part) for part, control in self.lexer.push(text))

    def quote(self) -> str:
        """The `<|"|>` token: a string opens or closes."""
        if self.done:
            return ""
        self.in_string = not self.in_string
        if not self.in_string and self.stack and self.stack[-1] == "{":  # a quoted key: its value follows the ':'
            self.stack[-1] = "key"
        return '"'

    def text(self, text: str) -> str:
        """Text between control tokens."""
        if self.done:
            return ""
        if self.in_string:
            return json.dumps(text, ensure_ascii=False)[1:-1]
        out: list[str] = []
        for ch in text:
            if self.done:
                break
            if ch in "{[":
                out.append(self._end_word() + ch)
                self.stack.append("{" if ch == "{" else "[")
            elif ch in "}]":
                out.append(self._end_word() + ch)
                if self.stack:
                    self.stack.pop()
                if self.stack and self.stack[-1] == ":":
                    self.stack[-1] = "{"
                self.done = not self.stack
            elif ch == ":" and self.stack and self.stack[-1] in ("{", "key"):
                key = self.word
                self.word = ""
                out.append((json.dumps(key) if self.stack[-1] == "{" else "") + ": ")
                self.stack[-1] = ":"
            elif ch == ",":
                out.append(self._end_word() + ", ")
                if self.stack and self.stack[-1] == ":":
                    self.stack[-1] = "{"
            elif not ch.isspace() or self.word:
                self.word += ch
        return "".join(out)

    def _end_word(self) -> str:
        """A bare scalar ends: as JSON (true, false, null and numbers are already; NaN and Infinity stay as
        written, which is not JSON, so the call is malformed; anything else is a string)."""
        word, self.word = self.word.strip(), ""
        if not word or (self.stack and self.stack[-1] == "{"):
            return ""
        if word in NON_FINITE or _is_json(word):
            return word
        return json.dumps(word, ensure_ascii=False)


def not_json(name: str) -> Any:
    """json.loads' parse_constant: NaN, Infinity and -Infinity, which Python's json reads, are not JSON."""
    raise ValueError(f"{name} is not JSON")


def _is_json(text: str) -> bool:
    """Whether `text` is JSON (Python's json also reads NaN, Infinity and -Infinity, which JSON has not)."""
    try:
        json.loads(text, parse_constant=not_json)
        return True
    except ValueError:
        return False


def _partial_tail(text: str, marker: str, start: int = 0) -> int:
    """How many characters at the end of text[start:] could begin `marker`."""
    for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


@dataclass
class Call:
    name: str
    arguments: str = ""  # JSON text, as streamed


@dataclass
class Piece:
    """What a push of answer text gave: text for `content`, and per call its start and its arguments."""

    text: str = ""
    started: list[tuple[int, str]] = field(default_factory=list)  # (index, name)
    arguments: list[tuple[int, str]] = field(default_factory=list)  # (index, JSON text)


class CallSplitter:
    """A streamed answer into its text and its tool calls. Text before, between and after calls is
    content; `calls` are the calls read so far (the last may be incomplete). `marked`: the answer is
    marked (module docstring), and only marked control tokens open and close calls and strings."""

    def __init__(self, marked: bool = False):
        self.calls: list[Call] = []
        self.state = "text"  # "text", "name" (after <|tool_call>), "args"
        self.lexer = _Lexer((CALL_OPEN, CALL_CLOSE, QUOTE), marked)
        self.marked = marked
        self.head = ""  # the call's name so far, up to its "{"
        self.args = ArgsToJson(marked)

    def push(self, text: str) -> Piece:
        piece = Piece()
        for part, control in self.lexer.push(text):
            if control and part == CALL_OPEN:  # a call opens (one left open is left incomplete)
                self.state, self.head = "name", ""
            elif self.state == "text":
                piece.text += part
            elif control and part == CALL_CLOSE:  # the call ends, whole or not
                self.state = "text"
            elif self.state == "name":
                self._name(part, piece)
            elif control:
                self._arguments(self.args.quote(), piece)
            else:
                self._arguments(self.args.text(part), piece)
        return piece

    def _name(self, text: str, piece: Piece) -> None:
        """Text after <|tool_call>: `call:NAME` up to the "{" that opens the arguments."""
        self.head += text
        at = self.head.find("{")
        if at < 0:
            return
        name = self.head[:at].strip().removeprefix("call:").strip()
        self.calls.append(Call(name))
        piece.started.append((len(self.calls) - 1, name))
        self.args, self.state = ArgsToJson(self.marked), "args"
        self._arguments(self.args.text(self.head[at:]), piece)

    def _arguments(self, more: str, piece: Piece) -> None:
        if more:
            self.calls[-1].arguments += more
            piece.arguments.append((len(self.calls) - 1, more))

    def finish(self) -> Piece:
        """The end of the answer: held text is content (a marker's start was only text after all)."""
        held = self.lexer.finish()
        return Piece(held if self.state == "text" else "")


def complete(call: Call) -> bool:
    """Whether a call's arguments are a whole JSON object (NaN and Infinity are not JSON)."""
    try:
        return isinstance(json.loads(call.arguments, parse_constant=not_json), dict)
    except ValueError:
        return False
