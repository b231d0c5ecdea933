"""Gemma 4's tool-call format on its own (no model): the chat template writes calls and results as
Gemma 4 does, the forcing grammar accepts exactly what the template writes, and calls read back as
OpenAI's JSON arguments however the streamed text is cut."""

from __future__ import annotations

import json

import pytest
import torch

from flashdesk.engine.decode.grammar import GrammarState, lark, vocabulary
from flashdesk.engine.decode.tool_calls import ArgsToJson, CallSplitter, Markers, call_grammar

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
