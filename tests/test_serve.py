"""`flashdesk serve` (issue 12 item 1): the OpenAI-compatible API on the demo pair, driven by the official
`openai` client (and raw HTTP for what the client would refuse to send)."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time

import httpx
import openai
import pytest

from flashdesk.engine.hub.demo import create_demo

KEY = "test-key-123"
HELLO = "Write a Python function to return the n-th Fibonacci number."


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return create_demo(tmp_path_factory.mktemp("serve-demo"))


@pytest.fixture(scope="module")
def served(demo):
    """The demo pair behind the API on a free loopback port, with an API key: (base url, runner)."""
    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.decode.speculative import SpecControl
    from flashdesk.engine.serve.app import create_app
    from flashdesk.engine.serve.runner import Runner
    from flashdesk.engine.serve.server import Server, ServerThread, bind, config, served_name, url
    from flashdesk.engine.loading.model_card import sampling_defaults

    target, drafter = demo
    engine = Engine.load(target, device="cpu", draft_dir=drafter)
    runner = Runner(engine, SpecControl(enabled=True))
    app = create_app(runner, served_name(target), KEY, sampling_defaults(target))
    thread = ServerThread(Server(config(app, quiet=True), on_stopping=runner.close), bind("127.0.0.1", 0))
    thread.start()
    yield url("127.0.0.1", thread.port), runner
    runner.close()
    thread.stop()


@pytest.fixture
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _stream(client: openai.OpenAI, messages: list[dict], **kw) -> tuple[str, dict | None, list]:
    """The streamed text, the usage chunk's usage (as a dict) and the finish reasons seen."""
    chunks = list(
        client.chat.completions.create(
            model="flashdesk-demo", messages=messages, stream=True, stream_options={"include_usage": True}, **kw
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = next((c.usage.model_dump() for c in chunks if c.usage is not None), None)
    return text, usage, reasons


def _record(runner, job_id: str, timeout: float = 60):
    """The runner's record of a job, once it has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in runner.records if r.id == job_id]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not end")


# -- the reply ------------------------------------------------------------------------------------------


def test_streamed_reply_is_flashdesk_generate_and_reports_speculation(served, client, demo, capsys) -> None:
    from flashdesk.engine.cli.main import main

    assert (
        main(
            [
                "generate",
                "--model",
                str(demo[0]),
                "--draft",
                str(demo[1]),
                "--device",
                "cpu",
                "--prompt",
                HELLO,
                "--max-new-tokens",
                "32",
                "--json",
            ]
        )
        == 0
    )
    expected = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert expected["text"]

    text, usage, reasons = _stream(client, [{"role": "user", "content": HELLO}], max_tokens=32, temperature=0)
    assert text == expected["text"]
    assert reasons == [expected["finish_reason"]]
    assert usage["completion_tokens"] == len(expected["token_ids"])
    assert usage["prompt_tokens"] == len(expected["prompt_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    spec = usage["speculation"]
    assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"] and spec["tau"] >= 1


def test_whole_reply_equals_the_stream(client) -> None:
    messages = [
        {"role": "system", "content": "Answer with code."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Implement a class Stack "}, {"type": "text", "text": "in Python."}],
        },
    ]
    streamed, streamed_usage, _ = _stream(client, messages, max_tokens=40, temperature=0)
    whole = client.chat.completions.create(model="flashdesk-demo", messages=messages, max_tokens=40, temperature=0)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.content == streamed and streamed
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == streamed_usage["completion_tokens"]
    assert whole.usage.prompt_tokens == streamed_usage["prompt_tokens"]


def test_a_follow_up_reuses_the_conversation_prefix(client) -> None:
    first = [{"role": "user", "content": "Write a Python function that reads a file."}]
    reply = client.chat.completions.create(model="flashdesk-demo", messages=first, max_tokens=24, temperature=0)
    follow = first + [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "Now make it count the lines."},
    ]
    _, usage, _ = _stream(client, follow, max_tokens=24, temperature=0)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < usage["prompt_tokens"]
    assert cached >= reply.usage.prompt_tokens - 8  # the first turn's prompt, short of its generation prompt


def test_reasoning_effort_and_template_kwargs_turn_thinking_on(client) -> None:
    ask = {"model": "flashdesk-demo", "messages": [{"role": "user", "content": HELLO}], "max_tokens": 4}
    plain = client.chat.completions.create(**ask).usage.prompt_tokens
    effort = client.chat.completions.create(**ask, reasoning_effort="low").usage.prompt_tokens
    kwargs = client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    overruled = client.chat.completions.create(
        **ask, reasoning_effort="high", extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    none = client.chat.completions.create(**ask, reasoning_effort="none").usage.prompt_tokens
    assert effort > plain and kwargs.usage.prompt_tokens == effort  # <|think|> in a system turn
    assert overruled.usage.prompt_tokens == none == plain


class ScriptedRunner:
    """A runner that answers every job with the same thought and answer, as a thinking model would."""

    context_limit = 4096

    def __init__(self):
        from flashdesk.engine.serve.metrics import ServeMetrics

        self.metrics = ServeMetrics()

    def submit(self, job) -> None:
        from flashdesk.engine.serve.runner import JobDelta, JobDone, JobStarted, Usage

        for event in (
            JobStarted(10, 0, 20),
            JobDelta("", "Let me think. "),
            JobDelta("", "Yes."),
            JobDelta("The answer", ""),
            JobDelta(" is 4.", ""),
            JobDone("stop", Usage(10, 9)),
        ):
            job.sink(event)


def test_thoughts_go_to_reasoning_content() -> None:
    from flashdesk.engine.serve.app import create_app
    from flashdesk.engine.serve.server import Server, ServerThread, bind, config, url

    thread = ServerThread(Server(config(create_app(ScriptedRunner(), "thinker"), quiet=True)), bind("127.0.0.1", 0))
    thread.start()
    try:
        client = openai.OpenAI(base_url=url("127.0.0.1", thread.port) + "/v1", api_key="none", max_retries=0)
        ask = {"model": "thinker", "messages": [{"role": "user", "content": "2+2?"}], "reasoning_effort": "medium"}
        whole = client.chat.completions.create(**ask).choices[0].message
        assert whole.content == "The answer is 4."
        assert whole.model_extra["reasoning_content"] == "Let me think. Yes."
        deltas = [c.choices[0].delta for c in client.chat.completions.create(**ask, stream=True) if c.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "Let me think. Yes."
        assert "".join(d.content or "" for d in deltas) == "The answer is 4."
        assert not any(d.content and d.model_extra.get("reasoning_content") for d in deltas)
    finally:
        thread.stop()


def test_stop_strings_end_the_reply(client) -> None:
    full = (
        client.chat.completions.create(
            model="flashdesk-demo", messages=[{"role": "user", "content": HELLO}], max_tokens=32, temperature=0
        )
        .choices[0]
        .message.content
    )
    word = next(w for w in re.findall(r"[A-Za-z_]{3,}", full) if full.index(w) > 0)
    cut = client.chat.completions.create(
        model="flashdesk-demo", messages=[{"role": "user", "content": HELLO}], max_tokens=32, temperature=0, stop=[word]
    )
    assert cut.choices[0].message.content == full[: full.index(word)]
    assert cut.choices[0].finish_reason == "stop"


# -- security --------------------------------------------------------------------------------------------


def test_an_exposed_address_without_a_key_is_refused_before_loading(monkeypatch, capsys) -> None:
    from flashdesk.engine.serve.auth import check_exposure
    from flashdesk.engine.serve.errors import ServeError
    from flashdesk.engine.cli import cli_args
    from flashdesk.engine.cli import main as cli

    def no_load(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli_args, "load_engine", no_load)
    monkeypatch.delenv("FLASHDESK_API_KEY", raising=False)
    assert cli.main(["serve", "--demo", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0 without an API key" in err and "--api-key" in err
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_exposure(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.20", "myhost.local"):
        with pytest.raises(ServeError):
            check_exposure(host, None)
        check_exposure(host, "a key")


def test_a_busy_port_is_refused_before_loading(monkeypatch, capsys) -> None:
    import socket

    from flashdesk.engine.cli import cli_args
    from flashdesk.engine.cli import main as cli

    def no_load(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli_args, "load_engine", no_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--demo", "--port", str(port)]) == 2
    assert f"cannot listen on http://127.0.0.1:{port}" in capsys.readouterr().err


def test_the_command_prints_its_url_serves_and_stops_on_ctrl_c(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "FLASHDESK_DATA_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    # a suite run in the background ignores SIGINT, and children inherit that: give it the default
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashdesk", "serve", "--demo", "--port", "0", "--device", "cpu", "--api-key", KEY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("flashdesk serve: flashdesk-demo at http://127.0.0.1:"), line + proc.stderr.read()
        assert "API key required" in line
        base = line.split(" at ")[1].split(" ")[0]
        reply = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0).chat.completions.create(
            model="flashdesk-demo", messages=USER, max_tokens=6
        )
        assert reply.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert "flashdesk serve: stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_missing_or_wrong_key_gets_401_and_health_needs_none(served) -> None:
    base = served[0]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    for path in ("/v1/models", "/metrics"):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY}"}):
            r = httpx.get(base + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
    r = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    health = httpx.get(base + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = openai.OpenAI(base_url=base + "/v1", api_key=KEY).models.list()
    assert [m.id for m in models.data] == ["flashdesk-demo"]


# -- malformed requests ------------------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]
MALFORMED = [  # (body as raw text or JSON, a word the error must name)
    ("{not json", "JSON"),
    ("[1, 2, 3]", "JSON object"),
    ({"messages": USER, "model": "gpt-4o"}, "gpt-4o"),
    ({"messages": USER, "max_tokens": 10**12}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user"}]}, "content"),
    ({"messages": [{"role": "user", "content": 42}]}, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "text"),
    ({"messages": USER + [{"role": "assistant", "content": "ok"}]}, "last message"),
    ({"messages": USER + [{"role": "system", "content": "late"}, {"role": "user", "content": "x"}]}, "system"),
    ({"messages": USER, "temperature": -0.5}, "temperature"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "top_p": 1.5}, "top_p"),
    ({"messages": USER, "stop": 7}, "stop"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "n": 3}, "n"),
    ({"messages": USER, "seed": 2**70}, "seed"),
    ({"messages": USER, "reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": [{"role": "user", "content": "tell me a story " * 1200}], "max_tokens": 1500}, "context"),
]


def test_malformed_requests_get_a_4xx_json_error_and_the_server_keeps_serving(served, client) -> None:
    base, headers = served[0], {"Authorization": f"Bearer {KEY}"}
    assert len(MALFORMED) >= 20
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        for body, word in MALFORMED:
            if isinstance(body, str):
                r = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
            else:
                r = http.post("/v1/chat/completions", json=body)
            assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert word.lower() in error["message"].lower(), (word, error)
        for kind in ("text/plain", "application/x-www-form-urlencoded", None):  # what a web form sends unasked
            r = http.post(
                "/v1/chat/completions", content=json.dumps({"messages": USER}), headers={"Content-Type": kind or ""}
            )
            assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]["message"], kind
        assert http.post("/v1/chat/completions", content=b"x" * (17 << 20)).status_code == 413
        assert http.get("/v1/nothing").json()["error"]["message"].startswith("no such endpoint")
        assert http.get("/v1/chat/completions").status_code == 405
    reply = client.chat.completions.create(model="flashdesk-demo", messages=USER, max_tokens=8)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1


# -- cancelling, metrics --------------------------------------------------------------------------------


def test_a_client_that_disconnects_stops_its_generation(served, client) -> None:
    runner = served[1]
    runner.step_delay = 0.02  # long enough that the reply could not finish before the disconnect is seen
    try:
        stream = client.chat.completions.create(
            model="flashdesk-demo",
            messages=[{"role": "user", "content": HELLO}],
            max_tokens=2000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        seen = []
        for chunk in stream:
            seen.append(chunk)
            if len(seen) == 4:
                break
        stream.close()
        record = _record(runner, seen[0].id)
    finally:
        runner.step_delay = 0.0
    assert record.reason == "cancelled" and record.status == 499
    assert record.cancel_step is not None and record.last_step <= record.cancel_step  # no step began after it
    assert record.last_step < 400  # 2000 tokens would take hundreds of steps
    reply = client.chat.completions.create(model="flashdesk-demo", messages=USER, max_tokens=4)
    assert reply.usage.completion_tokens >= 1  # the engine is free again


def test_a_stream_whose_client_leaves_before_its_first_chunk_never_runs(served) -> None:
    """A stream queued behind a busy engine, its client gone before anything was sent: the job is
    cancelled where it waits, and runs no step (not left for the time limit)."""
    base, runner = served
    known = {r.id for r in runner.records}
    runner.step_delay = 0.02
    busy = threading.Thread(
        target=lambda: httpx.post(
            base + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=120,
            json={"messages": USER, "max_tokens": 120, "ignore_eos": True},
        )
    )
    try:
        busy.start()
        deadline = time.monotonic() + 30
        while not runner.metrics.gauges["flashdesk_requests_running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        host, port = base.removeprefix("http://").split(":")
        body = json.dumps({"messages": USER, "max_tokens": 2000, "stream": True, "ignore_eos": True})
        with socket.create_connection((host, int(port))) as raw:  # sends the request, reads nothing, leaves
            raw.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            time.sleep(0.3)
        busy.join(timeout=120)
        deadline = time.monotonic() + 30
        while len(new := [r for r in runner.records if r.id not in known]) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runner.step_delay = 0.0
    left = [r for r in new if r.stream]
    assert len(left) == 1 and left[0].reason == "cancelled" and left[0].last_step == -1, new


def test_a_client_that_gives_up_on_a_whole_reply_stops_it(served) -> None:
    """Without streaming nothing is sent until the end, so the server watches the connection itself."""
    base, runner = served
    known = {r.id for r in runner.records}
    runner.step_delay = 0.02
    try:
        with pytest.raises(httpx.ReadTimeout):  # the client hangs up while the reply is being generated
            httpx.post(
                base + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=1.0,
                json={"messages": USER, "max_tokens": 2000, "ignore_eos": True},
            )
        deadline = time.monotonic() + 60
        while not (new := [r for r in runner.records if r.id not in known]) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runner.step_delay = 0.0
    assert len(new) == 1
    record = new[0]
    assert record.reason == "cancelled" and record.status == 499 and not record.stream
    assert record.last_step <= record.cancel_step and record.usage.completion_tokens < 2000


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"\})? (\S+)$')


def parse_prometheus(text: str) -> dict[str, dict]:
    """Prometheus text format 0.0.4, strictly: {family: {"type", "help", "samples": {name+labels: value}}}."""
    families: dict[str, dict] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, what, name, rest = line.split(" ", 3)
            families.setdefault(name, {"samples": {}})[what.lower()] = rest
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        family = next((f for f in families if name in (f, f + "_bucket", f + "_sum", f + "_count")), None)
        assert family is not None and "type" in families[family], f"{name} has no TYPE line before it"
        number = float(value)
        assert not math.isnan(number)
        families[family]["samples"][name + (labels or "")] = number
    for name, family in families.items():
        assert family["type"] in ("counter", "gauge", "histogram") and family.get("help"), name
        if family["type"] == "histogram":
            buckets = [(k, v) for k, v in family["samples"].items() if "_bucket" in k]
            bounds = [float(re.search(r'le="([^"]+)"', k).group(1)) for k, _ in buckets]
            assert bounds == sorted(bounds) and bounds[-1] == math.inf
            counts = [v for _, v in buckets]
            assert counts == sorted(counts) and counts[-1] == family["samples"][name + "_count"]
    return families


def test_metrics_parse_and_move_after_a_request(served, client) -> None:
    base, headers = served[0], {"Authorization": f"Bearer {KEY}"}

    def scrape() -> dict[str, float]:
        r = httpx.get(base + "/metrics", headers=headers)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        families = parse_prometheus(r.text)
        samples = {k: v for f in families.values() for k, v in f["samples"].items()}
        for name, family in families.items():  # the speculation counters: a sample per method, summed here
            if name.startswith("flashdesk_spec_"):
                assert name not in family["samples"] and family["samples"], name
                samples[name] = sum(family["samples"].values())
        return samples

    before = scrape()
    names = [
        "flashdesk_requests_total",
        "flashdesk_prompt_tokens_total",
        "flashdesk_generation_tokens_total",
        "flashdesk_cached_prompt_tokens_total",
        "flashdesk_spec_steps_total",
        "flashdesk_spec_draft_tokens_total",
        "flashdesk_spec_accepted_tokens_total",
        "flashdesk_spec_emitted_tokens_total",
        "flashdesk_requests_running",
        "flashdesk_requests_waiting",
        "flashdesk_step_seconds_count",
        "flashdesk_time_to_first_token_seconds_count",
    ]
    for name in names:
        assert name in before, name
    reply = client.chat.completions.create(
        model="flashdesk-demo",
        messages=[{"role": "user", "content": HELLO}],
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    after = scrape()
    moved = {name: after[name] - before[name] for name in names}
    assert moved["flashdesk_requests_total"] == 1
    assert moved["flashdesk_prompt_tokens_total"] == reply.usage.prompt_tokens
    assert moved["flashdesk_generation_tokens_total"] == reply.usage.completion_tokens == 24
    assert moved["flashdesk_cached_prompt_tokens_total"] == reply.usage.prompt_tokens_details.cached_tokens
    spec = reply.usage.model_extra["speculation"]
    assert moved["flashdesk_spec_draft_tokens_total"] == spec["drafted"] > 0
    assert spec["method"] == "dflash" and spec["by_method"]["dflash"]["drafted"] == spec["drafted"]
    assert after['flashdesk_spec_draft_tokens_total{method="dflash"}'] == after["flashdesk_spec_draft_tokens_total"]
    assert moved["flashdesk_spec_accepted_tokens_total"] == spec["accepted"]
    assert moved["flashdesk_spec_steps_total"] == spec["speculative_steps"] >= 1
    assert moved["flashdesk_time_to_first_token_seconds_count"] == 1
    assert moved["flashdesk_step_seconds_count"] >= spec["speculative_steps"]
    assert after["flashdesk_requests_running"] == after["flashdesk_requests_waiting"] == 0


def test_a_reply_is_continued_with_vllms_continue_final_message(client, demo) -> None:
    """Messages ending with the assistant's text and continue_final_message: the prompt is the
    template's with that turn left open (as transformers renders it), and the model writes on."""
    from transformers import AutoTokenizer

    question = [{"role": "user", "content": "def fib(n):"}]
    whole = (
        client.chat.completions.create(model="flashdesk-demo", messages=question, max_tokens=24, temperature=0)
        .choices[0]
        .message.content
    )
    cut = whole[: len(whole) // 2].rstrip()
    messages = [*question, {"role": "assistant", "content": cut}]
    reply = client.chat.completions.create(
        model="flashdesk-demo",
        messages=messages,
        max_tokens=12,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    reference = AutoTokenizer.from_pretrained(demo[0]).apply_chat_template(
        messages, continue_final_message=True, add_generation_prompt=False, tokenize=True
    )
    reference = reference["input_ids"] if hasattr(reference, "keys") else reference
    assert reply.usage.prompt_tokens == len(reference) and reply.choices[0].message.content

    refusals = [
        ({"continue_final_message": True}, "continue_final_message"),  # without add_generation_prompt: false
        ({"add_generation_prompt": False}, "continue_final_message"),
    ]
    for extra, param in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="flashdesk-demo", messages=[*question, {"role": "assistant", "content": cut}], extra_body=extra
            )
        assert refused.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as refused:  # the last word is the user's: nothing to go on with
        client.chat.completions.create(
            model="flashdesk-demo",
            messages=question,
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
    assert refused.value.body["param"] == "messages[0].role"
