"""The server on the worker's loaded engine (issue 12 item 2, engine side): StartServer / StopServer over the
protocol with the real worker process, HTTP requests taking turns with the app's own generations, and a
ServerTraffic event per request."""

from __future__ import annotations

import httpx
import openai
import pytest

from flashdesk import protocol as p
from test_worker import HELLO, WorkerProcess, _load


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from flashdesk.engine.hub.demo import create_demo

    return create_demo(tmp_path_factory.mktemp("serve-worker-demo"))


def _state(w: WorkerProcess) -> p.ServerState:
    return w.until(p.ServerState)[-1]


def test_start_serve_and_stop_on_the_loaded_engine(demo) -> None:
    w = WorkerProcess()
    try:
        assert isinstance(w.next(), p.Ready)
        w.send(p.StartServer("127.0.0.1", 0, "k"))
        refused = _state(w)
        assert not refused.running and "load a model first" in refused.error

        _load(w, demo)
        w.send(p.StartServer("0.0.0.0", 0, None))
        exposed = _state(w)
        assert not exposed.running and "without an API key" in exposed.error

        w.send(p.StartServer("127.0.0.1", 0, "k"))
        state = _state(w)
        assert state.running and state.url.startswith("http://127.0.0.1:") and state.port > 0
        assert state.model == "flashdesk-demo" and state.api_key_required
        client = openai.OpenAI(base_url=state.url + "/v1", api_key="k", max_retries=0, timeout=60)

        # an HTTP request and an app generation of the same turn: the same reply, one after the other
        w.send(p.Generate("app", HELLO, max_tokens=24))
        w.until(p.Started)  # the app's turn holds the engine; the HTTP request waits for it
        reply = client.chat.completions.create(model="flashdesk-demo", messages=HELLO, max_tokens=24, temperature=0)
        seen = w.until(p.ServerTraffic)
        finished = [m for m in seen if isinstance(m, p.Finished)]
        traffic = seen[-1]
        assert len(finished) == 1 and seen.index(finished[0]) < len(seen) - 1
        assert reply.choices[0].message.content == finished[0].text
        assert traffic.status == 200 and traffic.reason == reply.choices[0].finish_reason == finished[0].reason
        assert traffic.request_id == reply.id and not traffic.stream
        assert (traffic.prompt_tokens, traffic.completion_tokens) == (
            reply.usage.prompt_tokens,
            reply.usage.completion_tokens,
        )
        assert traffic.drafted == reply.usage.model_extra["speculation"]["drafted"] > 0
        # the app's conversation is its own: an API client never reuses (nor learns the length of) its prefix
        assert traffic.cached_tokens == reply.usage.prompt_tokens_details.cached_tokens == 0
        again = client.chat.completions.create(model="flashdesk-demo", messages=HELLO, max_tokens=24, temperature=0)
        assert w.until(p.ServerTraffic)[-1].cached_tokens == again.usage.prompt_tokens_details.cached_tokens > 0

        # a refusal is traffic too
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="flashdesk-demo", max_tokens=2000, messages=[{"role": "user", "content": "story " * 4000}]
            )
        refused_traffic = w.until(p.ServerTraffic)[-1]
        assert refused_traffic.status == 400 and refused_traffic.reason == "refused"
        assert "context" in refused_traffic.message

        w.send(p.StopServer())
        assert not _state(w).running
        with pytest.raises(httpx.ConnectError):
            httpx.get(state.url + "/health")

        # a Load or an Unload stops it first
        w.send(p.StartServer("127.0.0.1", 0, None))
        again = _state(w)
        assert again.running and not again.api_key_required
        assert httpx.get(again.url + "/v1/models").status_code == 200
        w.send(p.Unload())
        seen = w.until(p.Unloaded)
        assert any(isinstance(m, p.ServerState) and not m.running for m in seen)
        with pytest.raises(httpx.ConnectError):
            httpx.get(again.url + "/health")
    finally:
        assert w.close() == 0


def test_stopping_ends_a_request_the_server_was_running(demo) -> None:
    """StopServer acts at once, even while an HTTP reply holds the engine: the reply stops after its step."""
    w = WorkerProcess(FLASHDESK_WORKER_STEP_DELAY="0.02")
    try:
        assert isinstance(w.next(), p.Ready)
        _load(w, demo)
        w.send(p.StartServer("127.0.0.1", 0, None))
        state = _state(w)
        with httpx.Client(timeout=60) as http:
            with http.stream(
                "POST",
                state.url + "/v1/chat/completions",
                json={"messages": HELLO, "max_tokens": 2000, "stream": True, "ignore_eos": True},
            ) as r:
                lines = r.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                w.send(p.StopServer())
                rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]" and "server is stopping" in rest[-2]
        traffic = w.until(p.ServerTraffic)[-1]
        assert traffic.status == 503 and traffic.reason == "cancelled" and traffic.completion_tokens < 2000
        assert not _state(w).running
    finally:
        assert w.close() == 0
