"""`flashdesk serve` names the speculative method (issue 32): a target with both draft models loaded
(z-lab's DFlash drafter and Gemma 4's MTP assistant) answers a request per method, and the usage's
`speculation` block and `/metrics` (labelled by method) say which one drafted, with figures that
agree: the usage from the engine's end-of-reply statistics, /metrics from each step as it ran."""

from __future__ import annotations

import json

import httpx
import pytest

from test_serve import parse_prometheus
from tiny_assistant import write_echo_assistant

MODEL = "tiny-pair"
METHODS = ("dflash", "mtp")
# /metrics counter -> the usage's figure it must have moved by
SPEC_COUNTERS = {
    "flashdesk_spec_steps_total": "speculative_steps",
    "flashdesk_spec_draft_tokens_total": "drafted",
    "flashdesk_spec_accepted_tokens_total": "accepted",
}
ASK = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a Python function to add two numbers."}],
    "max_tokens": 24,
    "temperature": 0,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def served(spec_pair, tmp_path_factory):
    """The spec pair's target with its DFlash drafter and an MTP assistant beside it, behind the API:
    (an HTTP client on it, the runner)."""
    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.decode.speculative import SpecControl
    from flashdesk.engine.serve.app import create_app
    from flashdesk.engine.serve.runner import Runner
    from flashdesk.engine.serve.server import Server, ServerThread, bind, config, url

    target_dir, draft_dir = spec_pair[1]
    assistant_dir = tmp_path_factory.mktemp("serve-assistant")
    write_echo_assistant(assistant_dir, spec_pair[2], seed=4)
    engine = Engine.load(target_dir, device="cpu", draft_dir=draft_dir, assistant_dir=assistant_dir)
    assert engine.methods.keys() == {"dflash", "mtp"} and engine.method == "dflash"
    runner = Runner(engine, SpecControl(enabled=True))
    thread = ServerThread(
        Server(config(create_app(runner, MODEL), quiet=True), on_stopping=runner.close), bind("127.0.0.1", 0)
    )
    thread.start()
    with httpx.Client(base_url=url("127.0.0.1", thread.port), timeout=120) as http:
        yield http, runner
    runner.close()
    thread.stop()


@pytest.fixture
def control(served):
    """The runner's SpecControl (read at every step, as the app's switches change it), put back after."""
    control = served[1].control
    saved = (control.enabled, control.draft_length, control.method)
    yield control
    control.enabled, control.draft_length, control.method = saved


def scrape(http: httpx.Client) -> dict:
    """/metrics, strictly parsed: {family: {"type", "help", "samples"}}."""
    r = http.get("/metrics")
    assert r.status_code == 200
    return parse_prometheus(r.text)


def per_method(families: dict, name: str) -> dict[str, float]:
    """A speculation counter's samples by their method label; it has no unlabelled sample (which a
    reader summing the family would count twice)."""
    samples = families[name]["samples"]
    assert name not in samples, f"{name} has an unlabelled sample beside the labelled ones"
    out = {}
    for key, value in samples.items():
        assert key.startswith(name + '{method="') and key.endswith('"}'), key
        out[key[len(name) + len('{method="') : -2]] = value
    return out


def moved(before: dict, after: dict, name: str) -> dict[str, float]:
    a, b = per_method(after, name), per_method(before, name)
    return {m: a[m] - b.get(m, 0) for m in a}


def whole(http: httpx.Client) -> dict:
    r = http.post("/v1/chat/completions", json=ASK)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def streamed(http: httpx.Client) -> dict:
    """The usage of a streamed reply (its last chunk, with stream_options.include_usage)."""
    body = {**ASK, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    usages = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usages) == 1 and not chunks[-1]["choices"]
    return usages[0]


def check_adds_up(spec: dict, before: dict, after: dict) -> None:
    """The usage's per-method figures sum to its totals, and /metrics moved, method by method, by
    what the usage says each method did (and no other method's counters moved)."""
    by_method = spec["by_method"]
    assert by_method and set(by_method) <= set(METHODS)
    for key in ("speculative_steps", "drafted", "accepted"):
        assert sum(f[key] for f in by_method.values()) == spec[key]
    for name, key in SPEC_COUNTERS.items():
        assert moved(before, after, name) == {m: by_method[m][key] if m in by_method else 0 for m in METHODS}, name
    emitted = moved(before, after, "flashdesk_spec_emitted_tokens_total")
    for m in METHODS:  # tau: tokens emitted per speculative step
        expected = by_method[m]["tau"] * by_method[m]["speculative_steps"] if m in by_method else 0
        assert emitted[m] == pytest.approx(expected)
    for figures in by_method.values():
        assert figures["drafted"] > 0 and 0 <= figures["accepted"] <= figures["drafted"]
        assert figures["acceptance_rate"] == pytest.approx(figures["accepted"] / figures["drafted"])
        assert figures["tau"] >= 1


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_usage_and_metrics_name_the_method_that_drafted(served, control, method, stream) -> None:
    http, _ = served
    control.method = method
    before = scrape(http)
    usage = (streamed if stream else whole)(http)
    after = scrape(http)
    spec = usage["speculation"]
    assert spec["method"] == method
    assert set(spec["by_method"]) == {method}  # only the named method drafted
    assert spec["by_method"][method]["drafted"] == spec["drafted"] > 0
    check_adds_up(spec, before, after)
    assert usage["completion_tokens"] == ASK["max_tokens"]


def test_the_automatic_method_is_named_auto_and_its_steps_by_their_method(served, control) -> None:
    http, _ = served
    control.method = "auto"
    before = scrape(http)
    spec = whole(http)["speculation"]
    after = scrape(http)
    assert spec["method"] == "auto" and spec["drafted"] > 0
    check_adds_up(spec, before, after)


def test_without_a_method_the_default_is_named_and_with_speculation_off_none(served, control) -> None:
    http, runner = served
    control.method = None
    spec = whole(http)["speculation"]
    assert spec["method"] == runner.engine.method == "dflash" and set(spec["by_method"]) == {"dflash"}
    control.enabled = False
    before = scrape(http)
    spec = whole(http)["speculation"]
    after = scrape(http)
    assert spec["method"] is None and spec["by_method"] == {} and spec["drafted"] == 0 and spec["tau"] is None
    for name in (*SPEC_COUNTERS, "flashdesk_spec_emitted_tokens_total"):
        assert moved(before, after, name) == {"dflash": 0, "mtp": 0}


def test_metrics_publish_each_loaded_method_from_the_start_and_the_app_still_reads_totals(served) -> None:
    from flashdesk.app.backends.prom_metrics import parse
    from flashdesk.app.backends.server_metrics import read_flashdesk
    from flashdesk.engine.serve.metrics import SPEC_COUNTERS as LABELLED
    from flashdesk.engine.serve.metrics import ServeMetrics

    fresh = parse_prometheus(ServeMetrics(["mtp", "dflash"]).exposition())
    for name in LABELLED:
        assert per_method(fresh, name) == {"dflash": 0, "mtp": 0}
        assert "by the method" in fresh[name]["help"] or "by method" in fresh[name]["help"], name
    assert "dflash" in fresh["flashdesk_spec_draft_tokens_total"]["help"]
    assert "mtp" in fresh["flashdesk_spec_draft_tokens_total"]["help"]
    plain = parse_prometheus(ServeMetrics().exposition())  # no draft model: the families, no samples
    assert all(plain[name]["samples"] == {} and plain[name]["type"] == "counter" for name in LABELLED)

    http, _ = served
    text = http.get("/metrics").text
    families = parse_prometheus(text)
    snapshot = read_flashdesk(parse(text), 0.0)  # the app's remote panels sum a counter's samples
    assert snapshot.draft_tokens == sum(per_method(families, "flashdesk_spec_draft_tokens_total").values())
    assert snapshot.drafts == sum(per_method(families, "flashdesk_spec_steps_total").values())
    assert snapshot.emitted_tokens == sum(per_method(families, "flashdesk_spec_emitted_tokens_total").values())


def test_a_draft_that_names_no_method_is_counted_as_unknown() -> None:
    from flashdesk.engine.serve.metrics import ServeMetrics

    metrics = ServeMetrics(["dflash"])
    metrics.step(0.01, emitted=3, drafted=4, accepted=2, method="dflash")
    metrics.step(0.01, emitted=1, drafted=0, accepted=0)  # a plain step: no speculation counter moves
    metrics.step(0.01, emitted=2, drafted=3, accepted=1)
    families = parse_prometheus(metrics.exposition())
    assert per_method(families, "flashdesk_spec_draft_tokens_total") == {"dflash": 4, "unknown": 3}
    assert per_method(families, "flashdesk_spec_emitted_tokens_total") == {"dflash": 3, "unknown": 2}
    assert per_method(families, "flashdesk_spec_steps_total") == {"dflash": 1, "unknown": 1}
    assert families["flashdesk_generation_tokens_total"]["samples"] == {"flashdesk_generation_tokens_total": 6}
