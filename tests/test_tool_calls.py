"""Gemma 4's tool-call format on its own (no model): the chat template writes calls and results as
Gemma 4 does, the forcing grammar accepts exactly what the template writes, and calls read back as
OpenAI's JSON arguments however the streamed text is cut."""

from __future__ import annotations

import json

import pytest
import torch

from flashdesk.engine.decode.grammar import GrammarError, GrammarState, lark, vocabulary
from flashdesk.engine.decode.tool_calls import (
    MARK,
    ArgsToJson,
    Call,
    CallSplitter,
    Markers,
    call_grammar,
    complete,
    with_marks,
)

WEATHER = {
    "name": "get_weather",
    "description": "The weather now",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}},
            "tags": {"type": "array", "items": {"type": "string"}},
            "exact": {"type": "boolean"},
        },
        "required": ["city"],
    },
}
ARGUMENTS = {"city": 'Paris, "FR"', "days": 3, "where": {"lat": 48.85, "lon": 2.35}, "tags": ["a", "b c"]}
ARGUMENTS["exact"] = False


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tiny_tokenizer import write_tokenizer

    from flashdesk.engine.decode.chat_format import load_tokenizer

    folder = tmp_path_factory.mktemp("tool-tokenizer")
    write_tokenizer(folder)
    return load_tokenizer(folder)


def rendered(tokenizer, args=ARGUMENTS, answer="sunny"):
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": answer},
    ]
    tools = [{"type": "function", "function": WEATHER}]
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def test_the_template_declares_calls_and_answers_in_gemma_4s_format(tokenizer):
    text = rendered(tokenizer)
    assert '<|tool>declaration:get_weather{description:<|"|>The weather now<|"|>,parameters:{properties:{' in text
    assert 'city:{description:<|"|>The city<|"|>,type:<|"|>STRING<|"|>}' in text
    assert 'required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n' in text
    call = '<|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|"|>,days:3,exact:false,tags:[<|"|>a<|"|>,<|"|>b c<|"|>]'
    assert call + ",where:{lat:48.85,lon:2.35}}<tool_call|>" in text
    # the answer follows in the same model turn, which goes on after it (no new turn is opened)
    assert text.endswith('<tool_call|><|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>')


def test_the_forcing_grammar_accepts_what_the_template_writes_and_it_reads_back(tokenizer):
    markers = Markers.of(tokenizer)
    text = rendered(tokenizer)
    call = text[text.index("<|tool_call>") : text.index("<|tool_response>")]
    ids = tokenizer(call, add_special_tokens=False)["input_ids"] + [markers.response_open]
    state = GrammarState(vocabulary(tokenizer, 512, 106), lark(call_grammar([WEATHER], markers)), torch.device("cpu"))
    assert all(state.consume(t) for t in ids) and state.accepting()
    wrong = tokenizer(call.replace(",days:3", ",days:x"), add_special_tokens=False)["input_ids"]
    fresh = GrammarState(vocabulary(tokenizer, 512, 106), lark(call_grammar([WEATHER], markers)), torch.device("cpu"))
    assert not all(fresh.consume(t) for t in wrong)  # an integer it is not

    splitter = CallSplitter()
    splitter.push(call)
    (read,) = splitter.calls
    assert read.name == "get_weather" and json.loads(read.arguments) == ARGUMENTS


def test_arguments_stream_into_the_same_json_wherever_the_text_is_cut():
    gemma = '{city:<|"|>a "b"\n<|"|>,n:-1.5e3,ok:true,none:null,list:[1,<|"|>x<|"|>,{k:<|"|><|"|>}],o:{}}'
    want = {"city": 'a "b"\n', "n": -1500.0, "ok": True, "none": None, "list": [1, "x", {"k": ""}], "o": {}}
    for cut in range(1, len(gemma)):
        convert = ArgsToJson()
        text = convert.push(gemma[:cut]) + convert.push(gemma[cut:])
        assert json.loads(text) == want, cut
        assert convert.done


def test_text_around_calls_is_content_and_each_call_has_its_index():
    splitter = CallSplitter()
    stream = 'Let me look.<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{y:<|"|>z<|"|>}<tool_call|>'
    pieces = [splitter.push(stream[i : i + 5]) for i in range(0, len(stream), 5)]
    assert "".join(p.text for p in pieces) + splitter.finish().text == "Let me look."
    assert [s for p in pieces for s in p.started] == [(0, "a"), (1, "b")]
    assert [(c.name, json.loads(c.arguments)) for c in splitter.calls] == [("a", {"x": 1}), ("b", {"y": "z"})]


# -- issue 34: calls read by token, NaN, one call, the matcher's errors ----------------------------------------


def spelled(tokenizer, text: str) -> list[int]:
    """`text` in ordinary tokens only (a control token's string as its characters, as a model may write it)."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert not set(ids) & set(tokenizer.added_tokens_decoder)
    return ids


def engine_text(tokenizer, ids: list[int], stops: tuple[str, ...] = ()) -> list[str]:
    """The answer's text as serve gets it from the engine, one token a step: each step's text marked
    where a control token's text begins (generation.StepEvent.controls, runner.Job.marks)."""
    from flashdesk.engine.decode.generation import _TextOutput

    out = _TextOutput(tokenizer, stops)
    steps = []
    for tid in ids:
        answer = out.push([tid])[0]
        steps.append(with_marks(answer, out.controls(answer)))
    tail = out.finish()[0]
    return steps + [with_marks(tail, out.controls(tail))]


def test_a_control_tokens_characters_inside_an_argument_stay_in_the_argument(tokenizer):
    """`<tool_call|>` and `<|"|>` typed in a string argument neither end the call nor the string: only
    the real control tokens do (a stop string that is never hit holds text back, and cuts nothing)."""
    m = Markers.of(tokenizer)
    value = 'a<tool_call|>b<|"|>c}'
    ids = (
        spelled(tokenizer, "Sure. ")
        + [m.call_open]
        + spelled(tokenizer, "call:f{note:")
        + [m.quote]
        + spelled(tokenizer, value)
        + [m.quote]
        + spelled(tokenizer, ",n:2}")
        + [m.call_close]
        + spelled(tokenizer, " Done.")
    )
    for stops in ((), ("<tool_call|>x",)):
        splitter = CallSplitter(marked=True)
        text = "".join(splitter.push(step).text for step in engine_text(tokenizer, ids, stops)) + splitter.finish().text
        assert text == "Sure.  Done." and MARK not in text
        (call,) = splitter.calls
        assert call.name == "f" and json.loads(call.arguments) == {"note": value, "n": 2} and complete(call)


def test_a_calls_characters_in_plain_text_are_content_not_a_call(tokenizer):
    """The whole call spelled out in ordinary tokens (a model quoting the format) is text."""
    typed = 'Write <|tool_call>call:f{x:<|"|>y<|"|>}<tool_call|> to call.'
    splitter = CallSplitter(marked=True)
    pieces = [splitter.push(step) for step in engine_text(tokenizer, spelled(tokenizer, typed))]
    assert "".join(p.text for p in pieces) + splitter.finish().text == typed
    assert splitter.calls == [] and not any(p.started for p in pieces)


def test_marks_stay_whole_however_the_text_is_cut():
    text = 'x<|tool_call>call:f{s:<|"|>q<tool_call|><|"|>}<tool_call|><turn|>y'
    stream = with_marks(text, [1, 22, 40, 46, 58])  # all but the `<tool_call|>` typed in the string
    assert stream.replace(MARK, "") == text and stream.count(MARK + "<") == 5
    for cut in range(1, len(stream)):
        splitter = CallSplitter(marked=True)
        text = splitter.push(stream[:cut]).text + splitter.push(stream[cut:]).text + splitter.finish().text
        assert text == "x<turn|>y", cut  # a mark before another control token's text is dropped, its text kept
        assert [(c.name, json.loads(c.arguments)) for c in splitter.calls] == [("f", {"s": "q<tool_call|>"})], cut


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_arguments(word):
    convert = ArgsToJson()
    arguments = convert.push(f"{{x:{word},y:1}}")
    assert convert.done and not complete(Call("f", arguments))
    assert not complete(Call("f", f'{{"x": {word}}}'))
    assert complete(Call("f", f'{{"x": "{word}", "y": 1e999}}'))  # as a string, or a big number: JSON


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_an_earlier_calls_nan_arguments_are_a_400(word):
    from flashdesk.engine.serve.errors import ApiError
    from flashdesk.engine.serve.tools import template_messages

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": f'{{"x": {word}}}'}}
    with pytest.raises(ApiError) as caught:
        template_messages([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert caught.value.param == "messages[0].tool_calls[0].function.arguments"


def _plan(tokenizer, **body):
    from flashdesk.engine.serve.schema import ChatCompletionRequest
    from flashdesk.engine.serve.tools import Structure

    tools = [{"type": "function", "function": WEATHER}]
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=tools, **body)
    return Structure(tokenizer).plan(request)


def test_parallel_tool_calls_false_ends_an_auto_reply_at_its_first_calls_end(tokenizer):
    m = Markers.of(tokenizer)
    assert _plan(tokenizer, parallel_tool_calls=False).stop_ids == (m.response_open, m.call_close)
    assert _plan(tokenizer, tool_choice="auto", parallel_tool_calls=False).stop_ids == (m.response_open, m.call_close)
    assert _plan(tokenizer).stop_ids == _plan(tokenizer, parallel_tool_calls=True).stop_ids == (m.response_open,)
    # a call its close token ended (it is not in the text) is whole
    splitter = CallSplitter(marked=True)
    splitter.push(f'{MARK}<|tool_call>call:f{{x:{MARK}<|"|>y{MARK}<|"|>}}')
    (call,) = splitter.calls
    assert complete(call) and json.loads(call.arguments) == {"x": "y"}


def test_a_matcher_that_fails_mid_reply_is_an_error_not_a_quiet_end(tokenizer):
    """In its error state llguidance's mask allows only the end token: the reply would end as if whole."""
    state = GrammarState(vocabulary(tokenizer, 512, 106), lark('start: "ab" "c"\n'), torch.device("cpu"))
    a, b, c = spelled(tokenizer, "abc")
    assert state.consume(a) and not state.consume(c)  # a refused token is no error
    state.matcher.consume_token(c)  # what a resource limit mid-reply does: the matcher fails
    with pytest.raises(GrammarError, match="could not be held to its grammar"):
        state.bitmask()
    with pytest.raises(GrammarError):
        state.consume(b)


BOOK = {
    "name": "book",
    "parameters": {
        "type": "object",
        "$defs": {
            "room": {"type": "object", "properties": {"floor": {"type": "integer", "minimum": 1, "maximum": 9}}},
            "tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}},
        },
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
            "note": {"type": "string", "pattern": "a/b"},
            "room": {"$ref": "#/$defs/room", "description": "where"},
            "guests": {"type": "integer", "minimum": 1},
            "price": {"type": "number", "exclusiveMaximum": 100},
            "plan": {"$ref": "#/$defs/tree"},
            "when": {"type": "string", "pattern": "^noon|pm$"},
            "path": {"type": "string", "pattern": "^x/\\d/y$"},
            "look": {"type": "string", "pattern": "^(?=a)"},
        },
        "required": ["code", "guests", "room"],
    },
}


@pytest.mark.parametrize(
    ("args", "taken"),
    [
        ('code:<|"|>ABC-12<|"|>,guests:2,room:{floor:3}', True),
        ('code:<|"|>ABC-12<|"|>,guests:2,note:<|"|>x a/b y<|"|>,price:99.5,room:{floor:9}', True),
        ('code:<|"|>ABC-12<|"|>,guests:2,plan:{kids:[{kids:[]},{}]},room:{}', True),  # a recursive $ref
        ('code:<|"|>ABC-12<|"|>,guests:2,plan:{kids:[{kids:[1]}]},room:{}', False),  # recursion is enforced
        ('code:<|"|>ABC-12<|"|>,guests:2,room:{floor:3},when:<|"|>noon<|"|>', True),  # ^a|b$: either end
        ('code:<|"|>ABC-12<|"|>,guests:2,room:{floor:3},when:<|"|>at 9pm<|"|>', True),
        ('code:<|"|>ABC-12<|"|>,guests:2,room:{floor:3},when:<|"|>at noon!<|"|>', False),
        ('code:<|"|>ABC-12<|"|>,guests:2,path:<|"|>x/7/y<|"|>,room:{floor:3}', True),  # a slash, \d
        ('code:<|"|>ABC-12<|"|>,guests:2,path:<|"|>x/٧/y<|"|>,room:{floor:3}', False),  # \d is ASCII, as in JSON Schema
        ('code:<|"|>ABC-12<|"|>,guests:2,look:<|"|>anything<|"|>,room:{floor:3}', True),  # a lookahead: not enforced
        ('code:<|"|>abc-12<|"|>,guests:2,room:{floor:3}', False),  # not the pattern
        ('code:<|"|>ABC-12 <|"|>,guests:2,room:{floor:3}', False),  # anchored at the end
        ('code:<|"|>ABC-12<|"|>,guests:2,note:<|"|>ab<|"|>,room:{floor:3}', False),  # the pattern is nowhere in it
        ('code:<|"|>ABC-12<|"|>,guests:0,room:{floor:3}', False),  # under the minimum
        ('code:<|"|>ABC-12<|"|>,guests:2,room:{floor:12}', False),  # over the $ref's maximum
        ('code:<|"|>ABC-12<|"|>,guests:2,price:100,room:{floor:3}', False),  # not under the exclusive maximum
    ],
)
def test_the_forcing_grammar_follows_patterns_number_bounds_and_local_refs(tokenizer, args, taken):
    markers = Markers.of(tokenizer)
    grammar = lark(call_grammar([BOOK], markers))
    state = GrammarState(vocabulary(tokenizer, 512, 106), grammar, torch.device("cpu"))
    ids = tokenizer(f"<|tool_call>call:book{{{args}}}<tool_call|>", add_special_tokens=False)["input_ids"]
    ids.append(markers.response_open)
    assert (all(state.consume(t) for t in ids) and state.accepting()) == taken


def test_refs_resolve_only_as_pointers_and_are_written_once(tokenizer):
    """`#name` is no pointer (it does not silently become the root); a chain of definitions each
    used twice is written once each, not 2^depth times; a bound that is a boolean is no bound."""
    markers = Markers.of(tokenizer)
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(30)
    }
    defs["d30"] = {"type": "integer", "minimum": True}
    tool = {
        "name": "deep",
        "parameters": {
            "type": "object",
            "$defs": defs,
            "properties": {"x": {"$ref": "#/$defs/d0"}, "y": {"$ref": "#node"}},
        },
    }
    text = call_grammar([tool], markers)
    assert len(text) < 20_000 and "minimum" not in text
    state = GrammarState(vocabulary(tokenizer, 512, 106), lark(text), torch.device("cpu"))
    ids = tokenizer('<|tool_call>call:deep{y:<|"|>free<|"|>}<tool_call|>', add_special_tokens=False)["input_ids"]
    assert all(state.consume(t) for t in ids + [markers.response_open]) and state.accepting()
