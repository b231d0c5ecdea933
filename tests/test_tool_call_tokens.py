"""Issue 34's tool-call fixes on the demo pair, from the engine's tokens to OpenAI's objects: calls are read
by their control tokens (never by characters the model spelled), `parallel_tool_calls: false` lets one call
out under "auto", and a grammar's matcher that fails mid-reply fails the request rather than ending it.

The toy model says nothing sensible, so each reply here is held to a grammar that makes it what the test
needs; the server's own plan (tools.py) says what ends it. Jobs go to the Runner as the HTTP side queues
them (a tool's schema holding a control token's string is refused at the HTTP door, prompt.py)."""

from __future__ import annotations

import json
import queue
import re

import pytest

from flashdesk.engine.decode.grammar import lark
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.tool_calls import Markers, call_grammar
from flashdesk.engine.serve.completion import Completion
from flashdesk.engine.serve.runner import Job, JobDelta, JobDone, JobFailed
from flashdesk.engine.serve.tool_reply import ToolReply

TYPED = 'a<tool_call|>b<|"|>c}'  # a control token's characters, typed inside a string argument
NOTE = {
    "name": "note",
    "parameters": {"type": "object", "properties": {"text": {"type": "string", "enum": [TYPED]}}, "required": ["text"]},
}
ASK = [{"role": "user", "content": "Take a note."}]


def unforced(grammar_text: str) -> str:
    """The grammar without llguidance's forcing: it forces a literal's bytes as their canonical tokens,
    and the tokenizer reads `<tool_call|>` there as the control token, which the matcher then refuses
    (the last test). Unforced, the model writes the literal's characters in ordinary tokens."""
    return '%llguidance {"no_forcing": true}\n' + grammar_text


@pytest.fixture(scope="module")
def markers(runner) -> Markers:
    return Markers.of(runner.tokenizer)


def run(runner, grammar_text: str, stop_ids: tuple[int, ...], marks: bool = True) -> tuple[list, object]:
    """A greedy job under the grammar, as serve queues a reply read for calls: its deltas and its end."""
    events: queue.Queue = queue.Queue()
    job = Job(
        ASK,
        SamplingParams(temperature=0.0),
        160,
        sink=events.put,
        grammar=lark(grammar_text),
        stop_ids=stop_ids,
        marks=marks,
    )
    runner.submit(job)
    deltas = []
    while True:
        event = events.get(timeout=120)
        if isinstance(event, JobDelta):
            deltas.append(event)
        elif isinstance(event, (JobDone, JobFailed)):
            return deltas, event


def whole(deltas, end) -> dict:
    reply = ToolReply(Completion("chatcmpl-x", 0, "m"))
    return reply.whole("".join(d.content for d in deltas), "", end.reason, end.usage)["choices"][0]


def streamed(deltas, end) -> tuple[str, dict[int, dict], str]:
    """A stream's content, its calls by index (name and joined arguments) and its finish reason."""
    reply = ToolReply(Completion("chatcmpl-x", 0, "m"))
    chunks = [reply.delta(d) for d in deltas] + [reply.closing(end.reason)]
    bodies = [json.loads(c.removeprefix("data: ")) for c in chunks if c]
    content, calls, reason = "", {}, None
    for body in bodies:
        choice = body["choices"][0]
        content += choice["delta"].get("content") or ""
        for call in choice["delta"].get("tool_calls") or ():
            entry = calls.setdefault(call["index"], {"name": None, "arguments": ""})
            entry["name"] = call["function"].get("name") or entry["name"]
            entry["arguments"] += call["function"]["arguments"]
        reason = choice["finish_reason"] or reason
    return content, calls, reason


def test_a_control_tokens_characters_in_an_argument_stay_in_the_argument(runner, markers):
    """The grammar holds the string to TYPED in ordinary tokens (llguidance keeps control tokens out of
    a literal); only the real `<|"|>` and `<tool_call|>` end the string and the call."""
    deltas, end = run(runner, unforced(call_grammar([NOTE], markers, parallel=False)), (markers.response_open,))
    assert isinstance(end, JobDone) and end.reason == "stop"
    choice = whole(deltas, end)
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "note" and json.loads(call["function"]["arguments"]) == {"text": TYPED}
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    content, calls, reason = streamed(deltas, end)
    assert content == "" and reason == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("note", {"text": TYPED})]


def test_a_calls_characters_in_plain_text_are_content(runner, markers):
    typed = 'Say <|tool_call>call:note{text:<|"|>x<|"|>}<tool_call|> to call.'
    deltas, end = run(runner, unforced(f"start: {json.dumps(typed)}\n"), (markers.response_open,))
    choice = whole(deltas, end)
    assert choice["message"]["content"] == typed and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    assert streamed(deltas, end) == (typed, {}, "stop")


def test_parallel_tool_calls_false_lets_one_call_out_under_auto(runner, markers):
    """The plan of an "auto" request with parallel_tool_calls false, on a reply whose grammar writes two
    calls: the reply ends at the first call's end, and that call is whole."""
    from flashdesk.engine.serve.schema import ChatCompletionRequest
    from flashdesk.engine.serve.tools import Structure

    request = ChatCompletionRequest(
        messages=ASK, tools=[{"type": "function", "function": NOTE}], parallel_tool_calls=False
    )
    plan = Structure(runner.tokenizer).plan(request)
    assert plan.calls and plan.grammar is None
    one = call_grammar([NOTE], markers, parallel=False)
    call = re.search(r"^start: (r\d+) <", one, re.M).group(1)
    forced = unforced(one.replace(f"start: {call}", f"start: {call} {call}", 1))  # two calls, then <|tool_response>
    deltas, end = run(runner, forced, plan.stop_ids)
    choice = whole(deltas, end)
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"text": TYPED}]
    assert choice["finish_reason"] == "tool_calls"
    content, calls, reason = streamed(deltas, end)
    assert len(calls) == 1 and reason == "tool_calls"
    # the same reply where parallel calls are allowed: both come out
    deltas, end = run(runner, forced, (markers.response_open,))
    assert len(whole(deltas, end)["message"]["tool_calls"]) == 2


def test_a_matcher_failing_mid_reply_fails_the_request(runner, markers, monkeypatch):
    """llguidance's matcher in its error state allows only the end token: unchecked, the reply would end
    there as "stop", cut short. The job fails instead, saying why."""
    from flashdesk.engine.decode.grammar import GrammarState

    masks = 0
    original = GrammarState.bitmask

    def failing(self):
        nonlocal masks
        masks += 1
        if masks == 6:  # mid-reply, the matcher fails (as a resource limit makes it)
            self.matcher.consume_token(markers.call_close)
        return original(self)

    grammar = unforced(call_grammar([NOTE], markers, parallel=False))
    monkeypatch.setattr(GrammarState, "bitmask", failing)
    deltas, end = run(runner, grammar, (markers.response_open,))
    assert isinstance(end, JobFailed) and end.code == "engine_error"
    assert "could not be held to its grammar: Parser Error" in end.message and "<state>" not in end.message
    monkeypatch.undo()
    deltas, end = run(runner, grammar, (markers.response_open,))
    assert isinstance(end, JobDone) and end.reason == "stop"  # the engine goes on serving


def test_a_literal_the_matcher_cannot_follow_fails_the_request_rather_than_stall(runner, markers):
    """Forced, llguidance's mask allows only the `<tool_call|>` token for the literal's `<tool_call|>`, and
    its matcher refuses that token: unchecked, the model wrote it again and again up to max_tokens."""
    deltas, end = run(runner, call_grammar([NOTE], markers, parallel=False), (markers.response_open,))
    assert isinstance(end, JobFailed) and end.code == "engine_error"
    assert f"token {markers.call_close}, which its mask allowed, was refused" in end.message
