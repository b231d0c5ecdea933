"""Log probabilities (issue 34 item 3): the engine's, with speculation on equal to off, and the API's
`logprobs` in chat completions and in /v1/completions (raw prompts, `echo`, the legacy shape), with
the requests lm-eval's loglikelihood tasks make checked against the model's own forward pass."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import openai
import pytest
import torch

from flashdesk.engine.decode.generation import GenerationRequest, StepEvent
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.engine.hub.demo import create_demo

TOL = 1e-4  # a verify pass computes several rows at once: its logits differ from one row's in the last bits
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Write a Python function to return the n-th Fibonacci number."}]
CODE = "def fibonacci(n):\n    "


# -- the engine ---------------------------------------------------------------------------------------------


def _run(engine, prompt, n, control, sampling=None, top=3, **kw):
    """(token ids, logprobs of each, the step events) of a generation that asks for logprobs."""
    request = GenerationRequest(prompt, n, sampling or SamplingParams(), ignore_eos=True, logprobs=top, **kw)
    events = list(engine.generate(request, control))
    steps = [e for e in events if isinstance(e, StepEvent)]
    return events[-1].token_ids, [lp for e in steps for lp in e.logprobs or ()], steps


def _close(ours, theirs) -> None:
    """The same tokens, log probabilities and alternatives, up to the rounding of a wider pass."""
    assert [a.token for a in ours] == [b.token for b in theirs]
    for a, b in zip(ours, theirs):
        assert abs(a.logprob - b.logprob) < TOL, (a, b)
        assert [i for i, _ in a.top] == [i for i, _ in b.top], (a, b)
        assert all(abs(u - v) < TOL for (_, u), (_, v) in zip(a.top, b.top)), (a, b)


def forward_logprobs(engine, ids: list[int]) -> torch.Tensor:
    """log-softmax of the target's logits at every position of `ids`, in one pass on a cache of its own."""
    cache = engine.model.new_cache(len(ids) + 16, engine.kv_dtype)
    with torch.inference_mode():
        out = engine.model.forward(torch.tensor(ids, device=engine.model.device), cache, logits_rows="all")
    return torch.log_softmax(out.logits.float(), dim=-1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return create_demo(tmp_path_factory.mktemp("logprobs-demo"))


@pytest.fixture(scope="module")
def demo_engine(demo):
    from flashdesk.engine.decode.generation import Engine

    return Engine.load(demo[0], device="cpu", draft_dir=demo[1])


@pytest.fixture(scope="module")
def mtp_engine(tmp_path_factory):
    """A tiny MoE target with Gemma 4's MTP assistant (as test_assistant.py builds them)."""
    pytest.importorskip("transformers.models.gemma4_assistant")
    from flashdesk.engine.decode.generation import Engine
    from tiny_assistant import write_echo_assistant
    from tiny_checkpoints import write_checkpoint

    folder, assistant = tmp_path_factory.mktemp("lp-target"), tmp_path_factory.mktemp("lp-assistant")
    write_echo_assistant(assistant, write_checkpoint(folder, "causal", seed=5, tokenizer=False), seed=11)
    return Engine.load(folder, device="cpu", draft_dir=assistant)


def _prompt(engine) -> list[int]:
    if engine.tokenizer is None:
        return [2, 17, 91, 33, 250, 7, 7, 64, 301, 12, 5, 88]
    from flashdesk.engine.decode.chat_format import build_prompt_ids

    return build_prompt_ids(engine.tokenizer, HELLO, enable_thinking=False)


@pytest.mark.parametrize("which", ["dflash", "mtp"])
def test_speculation_reports_the_logprobs_plain_decoding_does(which, request) -> None:
    engine = request.getfixturevalue("demo_engine" if which == "dflash" else "mtp_engine")
    prompt = _prompt(engine)
    plain_ids, plain, _ = _run(engine, prompt, 40, SpecControl(enabled=False))
    accepted = 0
    for k in (3, 7):
        ids, ours, steps = _run(engine, prompt, 40, SpecControl(True, k))
        assert ids == plain_ids
        assert len(ours) == len(ids) and all(len(lp.top) == 3 for lp in ours)
        _close(ours, plain)
        accepted += sum(step.accepted for step in steps)
    assert accepted > 0  # drafts were accepted: their logprobs came from the verify pass


def test_sampled_speculation_reports_the_target_distribution_before_temperature(demo_engine) -> None:
    """The tokens a sampled, speculative reply emitted have the log probabilities one pass over the
    prompt and reply gives them, whatever the temperature and filters: the model's own distribution."""
    prompt = _prompt(demo_engine)
    sampling = SamplingParams(temperature=1.3, top_p=0.9, top_k=40, seed=7)
    ids, ours, steps = _run(demo_engine, prompt, 30, SpecControl(True, 5), sampling)
    assert sum(step.accepted for step in steps) > 0
    logp = forward_logprobs(demo_engine, prompt + ids)
    for i, (token, lp) in enumerate(zip(ids, ours)):
        row = logp[len(prompt) + i - 1]
        assert lp.token == token and abs(lp.logprob - row[token].item()) < TOL
        assert [t for t, _ in lp.top] == row.topk(3).indices.tolist()


def test_prompt_logprobs_are_one_pass_over_the_prompt(demo_engine, monkeypatch) -> None:
    from flashdesk.engine.decode import speculative

    monkeypatch.setattr(speculative, "PROMPT_LOGPROB_ROWS", 7)  # several chunks, one of a single row
    prompt = _prompt(demo_engine)[:22]
    _, _, steps = _run(demo_engine, prompt, 1, SpecControl(True), top=2, prompt_logprobs=True)
    shown = steps[0].prompt_logprobs
    assert len(shown) == len(prompt) and shown[0].logprob is None and shown[0].token == prompt[0]
    logp = forward_logprobs(demo_engine, prompt)
    for i in range(1, len(prompt)):
        assert shown[i].token == prompt[i]
        assert abs(shown[i].logprob - logp[i - 1, prompt[i]].item()) < TOL
        assert [t for t, _ in shown[i].top] == logp[i - 1].topk(2).indices.tolist()


def test_logprobs_cost_nothing_unless_asked(demo_engine, forbid_reads) -> None:
    """Without logprobs a step reads its tokens once and computes nothing more; with them, once more."""
    from flashdesk.engine.decode.speculative import Decoder

    prompt = _prompt(demo_engine)
    for top, reads in ((None, 1), (2, 2)):
        decoder = Decoder(
            demo_engine.model, demo_engine.drafter, 256, demo_engine.kv_dtype, SamplingParams(), set(), logprobs=top
        )
        decoder.prefill(prompt)
        assert (decoder.first_logprobs is None) == (top is None)
        forbid_reads["armed"] = True
        for control in (SpecControl(False), SpecControl(True, 4)):
            before = forbid_reads["reads"]
            result = decoder.step(32, control)
            assert forbid_reads["reads"] - before == reads
            assert (result.logprobs is None) == (top is None)
            assert result.logprobs is None or [lp.token for lp in result.logprobs] == result.emitted
        forbid_reads["armed"] = False
    _, _, steps = _run(demo_engine, prompt, 8, SpecControl(True), top=None)
    assert all(step.logprobs is None and step.prompt_logprobs is None for step in steps)


# -- the API ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner(demo_engine):
    from flashdesk.engine.serve.runner import Runner

    runner = Runner(demo_engine, SpecControl(enabled=True))
    yield runner
    runner.close()


@contextmanager
def serving(runner):
    from flashdesk.engine.serve.app import create_app
    from flashdesk.engine.serve.server import Server, ServerThread, bind, close_app, config, url

    app = create_app(runner, "flashdesk-demo")
    thread = ServerThread(Server(config(app, quiet=True)), bind("127.0.0.1", 0))
    thread.start()
    try:
        yield url("127.0.0.1", thread.port)
    finally:
        thread.stop()
        close_app(app)


@pytest.fixture(scope="module")
def base(runner):
    with serving(runner) as base:
        yield base


@pytest.fixture
def http(base):
    with httpx.Client(base_url=base, timeout=120) as client:
        yield client


@pytest.fixture
def client(base) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def speculation(runner):
    """Turn the server's speculation on or off for a test; on again after it."""
    yield lambda on: setattr(runner.control, "enabled", on)
    runner.control.enabled = True


def _events(http: httpx.Client, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _error(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_chat_logprobs_give_each_token_and_its_alternatives_whole_and_streamed(client) -> None:
    ask = dict(model="flashdesk-demo", messages=HELLO, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)
    whole = client.chat.completions.create(**ask)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 for t in content)
    for t in content:  # greedy: the token is the most likely one, and its bytes spell its text
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert bytes(t.bytes).decode("utf-8", errors="replace") == t.token
    assert b"".join(bytes(t.bytes) for t in content).decode() == whole.choices[0].message.content
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    # the second request reuses the first's prompt prefix: its prefill runs fewer rows, rounded alike
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(abs(a.logprob - b.logprob) < TOL for a, b in zip(streamed, content))
    assert [[u.token for u in t.top_logprobs] for t in streamed] == [[u.token for u in t.top_logprobs] for t in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    plain = client.chat.completions.create(**{**ask, "logprobs": None, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


def test_chat_logprobs_without_alternatives_and_what_is_refused(http) -> None:
    r = http.post(CHAT, json={"messages": HELLO, "max_tokens": 6, "logprobs": True})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and all(t["top_logprobs"] == [] for t in content)
    for extra, param in (
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
    ):
        assert _error(http.post(CHAT, json={"messages": HELLO, **extra}))["param"] == param


def test_chat_logprobs_are_the_same_with_speculation_on_and_off(http, speculation) -> None:
    ask = {"messages": HELLO, "max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": 4}
    speculation(False)
    off = http.post(CHAT, json=ask).json()
    speculation(True)
    on = http.post(CHAT, json=ask).json()
    assert on["usage"]["speculation"]["accepted"] > 0 and off["usage"]["speculation"]["drafted"] == 0
    assert on["choices"][0]["message"] == off["choices"][0]["message"]
    a, b = on["choices"][0]["logprobs"]["content"], off["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in a] == [t["token"] for t in b]
    assert all(abs(x["logprob"] - y["logprob"]) < TOL for x, y in zip(a, b))
    assert [[u["token"] for u in x["top_logprobs"]] for x in a] == [[u["token"] for u in y["top_logprobs"]] for y in b]


def test_completions_answer_a_raw_prompt_whole_and_streamed(client, http, demo_engine) -> None:
    whole = client.completions.create(model="flashdesk-demo", prompt=CODE, max_tokens=20, temperature=0)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    text = whole.choices[0].text
    assert text and whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 20
    ids = [demo_engine.tokenizer.bos_token_id] + demo_engine.tokenizer(CODE, add_special_tokens=False)["input_ids"]
    assert whole.usage.prompt_tokens == len(ids)
    ask = dict(model="flashdesk-demo", prompt=CODE, max_tokens=20, temperature=0)
    streamed = list(client.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == text
    assert streamed[-1].choices[0].finish_reason == "length"
    as_ids = http.post(TEXT, json={"prompt": ids, "max_tokens": 20, "temperature": 0}).json()
    one_of_ids = http.post(TEXT, json={"prompt": [ids], "max_tokens": 20, "temperature": 0}).json()
    assert as_ids["choices"][0]["text"] == one_of_ids["choices"][0]["text"] == text
    stop = text.strip()[3:6]
    cut = http.post(TEXT, json={"prompt": CODE, "max_tokens": 20, "temperature": 0, "stop": stop}).json()
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["choices"][0]["text"] == text[: text.index(stop)]
    usage = _events(http, TEXT, {"prompt": CODE, "max_tokens": 5, "stream_options": {"include_usage": True}})[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5


def test_completions_logprobs_in_the_legacy_shape_and_with_echo(http) -> None:
    ask = {"prompt": CODE, "max_tokens": 12, "temperature": 0, "logprobs": 2}
    plain = http.post(TEXT, json=ask).json()["choices"][0]
    shown = plain["logprobs"]
    assert set(shown) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(shown["tokens"]) == 12 and "".join(shown["tokens"]) == plain["text"]
    pairs = zip(shown["top_logprobs"], shown["token_logprobs"])
    assert all(len(top) == 2 and max(top.values()) == lp for top, lp in pairs)
    assert shown["text_offset"] == [sum(len(t) for t in shown["tokens"][:i]) for i in range(12)]
    echoed = http.post(TEXT, json={**ask, "echo": True}).json()
    choice = echoed["choices"][0]
    prompt_tokens = echoed["usage"]["prompt_tokens"]
    assert choice["text"] == CODE + plain["text"]
    lp = choice["logprobs"]
    assert lp["tokens"][0] == "<bos>" and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == prompt_tokens + 12 and lp["tokens"][prompt_tokens:] == shown["tokens"]
    assert all(abs(a - b) < TOL for a, b in zip(lp["token_logprobs"][prompt_tokens:], shown["token_logprobs"]))
    only = http.post(TEXT, json={**ask, "echo": True, "max_tokens": 0}).json()
    assert only["choices"][0]["text"] == CODE and only["usage"]["completion_tokens"] == 0
    assert only["choices"][0]["logprobs"]["tokens"] == lp["tokens"][:prompt_tokens]
    assert only["choices"][0]["logprobs"]["token_logprobs"][1:] == lp["token_logprobs"][1:prompt_tokens]
    chunks = _events(http, TEXT, {**ask, "echo": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    streamed = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]
    assert [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]] == lp["text_offset"]
    assert http.post(TEXT, json={"prompt": CODE, "max_tokens": 4}).json()["choices"][0]["logprobs"] is None


def test_completions_logprobs_are_the_same_with_speculation_on_and_off(http, speculation) -> None:
    ask = {"prompt": CODE, "max_tokens": 40, "temperature": 0, "logprobs": 5, "echo": True}
    speculation(False)
    off = http.post(TEXT, json=ask).json()
    speculation(True)
    on = http.post(TEXT, json=ask).json()
    assert on["usage"]["speculation"]["accepted"] > 0
    a, b = on["choices"][0], off["choices"][0]
    assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
    for x, y in zip(a["logprobs"]["token_logprobs"][1:], b["logprobs"]["token_logprobs"][1:]):
        assert abs(x - y) < TOL
    for x, y in zip(a["logprobs"]["top_logprobs"][1:], b["logprobs"]["top_logprobs"][1:]):
        assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < TOL for t in x)


REFUSED = [
    ({"suffix": "return x"}, "suffix"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": [[2, 5], [2, 6]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [2, 99999]}, "prompt"),
    ({"prompt": "x " * 5000, "max_tokens": 4}, "prompt"),
    ({"messages": HELLO}, "messages"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": 2}, "n"),
    ({"best_of": 3}, "best_of"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"logit_bias": {"5": 1}}, "logit_bias"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize("extra, param", REFUSED, ids=[p + str(i) for i, (_, p) in enumerate(REFUSED)])
def test_completions_refuse_what_they_cannot_honour_by_name(http, extra, param) -> None:
    body = {"prompt": CODE, **extra}
    if "messages" in extra:
        body.pop("prompt")
    error = _error(http.post(TEXT, json=body))
    assert error["param"] == param and error["message"], error


# -- what lm-eval's loglikelihood tasks ask ---------------------------------------------------------------

QUESTIONS = [
    ("Question: Which keyword defines a function in Python?\nAnswer:", [" def", " function", " lambda"]),
    ("Question: What does len([1, 2, 3]) return?\nAnswer:", [" 3", " 2", " None"]),
    ("Question: Which module reads JSON?\nAnswer:", [" json", " csv", " pickle"]),
]


def _encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """As lm-eval encodes a pair: the whole text, split after the context's tokens."""
    whole = tokenizer(context + continuation, add_special_tokens=True)["input_ids"]
    context_ids = tokenizer(context, add_special_tokens=True)["input_ids"]
    return context_ids, whole[len(context_ids) :]


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_lm_eval_loglikelihood_requests_match_the_models_forward_pass(http, demo_engine, max_tokens) -> None:
    """The requests of lm-eval's `local-completions` (token ids, echo, logprobs 1; max_tokens 1, or 0
    as other harnesses send): the sums it takes over the continuation, and whether each token was the
    greedy one, equal what one forward pass of the model gives."""
    for context, choices in QUESTIONS:
        for choice in choices:
            context_ids, continuation = _encode_pair(demo_engine.tokenizer, context, choice)
            ids = context_ids + continuation
            body = {"model": "flashdesk-demo", "prompt": [ids], "temperature": 0, "max_tokens": max_tokens}
            reply = http.post(TEXT, json={**body, "logprobs": 1, "seed": 1234, "echo": True}).json()
            shown = reply["choices"][0]["logprobs"]
            assert len(shown["token_logprobs"]) == len(ids) + max_tokens
            span = slice(len(context_ids), len(ids))  # lm-eval's [ctxlen:-1] with max_tokens 1
            values, tops = shown["token_logprobs"][span], shown["top_logprobs"][span]
            theirs = sum(values)
            greedy = all(lp == max(top.values()) for lp, top in zip(values, tops))
            logp = forward_logprobs(demo_engine, ids)
            positions = range(len(context_ids), len(ids))
            ours = sum(logp[i - 1, ids[i]].item() for i in positions)
            assert abs(theirs - ours) < TOL * len(continuation), (context, choice)
            assert greedy == all(logp[i - 1].argmax().item() == ids[i] for i in positions)
