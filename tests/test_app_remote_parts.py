"""The Qt-free parts of remote engines: the Prometheus reader, the vLLM/SGLang/FlashDesk readers and the
figures between two scrapes, server addresses, server-sent events, chunks, error sentences, and a
streamed reply turned into the worker protocol's messages."""

from __future__ import annotations

import math

import httpx
import pytest

from flashdesk import protocol as p
from flashdesk.app.backends.openai_client import (
    ChunkParts,
    SseEvents,
    chat_body,
    chunk_parts,
    connection_sentence,
    server_address,
    server_message,
    status_sentence,
)
from flashdesk.app.backends.prom_metrics import parse, parse_line
from flashdesk.app.backends.server_metrics import (
    FLASHDESK,
    SGLANG,
    VLLM,
    read_snapshot,
    server_kind,
    spec_between,
    tokens_per_second,
)
from flashdesk.app.backends.stream_steps import StreamSteps

# A vLLM 2-engine (data parallel) scrape, in prometheus_client's exposition: counters end in _total,
# each with a _created sample beside it.
VLLM_TEXT = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="google/gemma-4-26B-A4B-it"} {d0}
vllm:spec_decode_num_drafts_total{engine="1",model_name="google/gemma-4-26B-A4B-it"} {d1}
vllm:spec_decode_num_drafts_created{engine="0",model_name="google/gemma-4-26B-A4B-it"} 1.7383e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="google/gemma-4-26B-A4B-it"} {t0}
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="google/gemma-4-26B-A4B-it"} {t1}
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="google/gemma-4-26B-A4B-it"} {a0}
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="google/gemma-4-26B-A4B-it"} {a1}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="google/gemma-4-26B-A4B-it",position="0"} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="google/gemma-4-26B-A4B-it",position="1"} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="google/gemma-4-26B-A4B-it",position="0"} {q0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="google/gemma-4-26B-A4B-it",position="1"} {q1}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="google/gemma-4-26B-A4B-it"} {g}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="google/gemma-4-26B-A4B-it"} 1.0
"""


def vllm_text(**values) -> str:
    text = VLLM_TEXT
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(float(value)))
    return text


# -- the exposition format ------------------------------------------------------------------------


def test_prometheus_lines_with_escapes_comments_specials_and_timestamps() -> None:
    text = "\n".join(
        [
            '# HELP odd A help line with {braces} and "quotes".',
            "# TYPE odd gauge",
            'odd{path="C:\\\\temp",quote="say \\"hi\\"",nl="a\\nb",comma="x,}y",} 3.5 1712345678000',
            "no_labels 42",
            'spaced { a = "1" } 7',  # a label set with spaces is read too
            "nan_gauge NaN",
            "inf_gauge +Inf",
            "neg_inf -Inf",
            "sci 1.5e+09",
            'with_exemplar_total{a="1"} 4 # {trace_id="abc"} 1.0',
            'bad_value{a="1"} many',
            "bad_label{a=1} 2",
            '{"dotted.name"} 1',
            "   ",
            "# EOF",
            "after_eof 1",
        ]
    )
    m = parse(text)
    odd = m.get("odd")[0]
    assert odd.labels == {"path": "C:\\temp", "quote": 'say "hi"', "nl": "a\nb", "comma": "x,}y"}
    assert odd.value == 3.5 and m.types == {"odd": "gauge"}
    assert m.total("no_labels") == 42 and m.total("spaced") == 7 and m.get("spaced")[0].labels == {"a": "1"}
    assert math.isnan(m.total("nan_gauge")) and m.total("inf_gauge") == math.inf and m.total("neg_inf") == -math.inf
    assert m.total("sci") == 1.5e9 and m.total("with_exemplar_total") == 4
    assert m.skipped == 3  # the word value, the unquoted label, the quoted name: skipped, not fatal
    assert "after_eof" not in m.names() and m.total("missing") is None


def test_prometheus_sums_by_label_and_filters() -> None:
    m = parse(vllm_text(d0=10, d1=5, t0=40, t1=20, a0=12, a1=3, p0=7, p1=5, q0=2, q1=1, g=100))
    assert m.total("vllm:spec_decode_num_drafts_total") == 15
    assert m.total("vllm:spec_decode_num_drafts_total", engine="1") == 5
    assert m.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {"0": 9, "1": 6}
    assert parse_line('x{a="1"} 2').labels == {"a": "1"}


# -- the servers' figures ------------------------------------------------------------------------


def test_vllm_figures_are_the_differences_between_two_scrapes() -> None:
    before = read_snapshot(parse(vllm_text(d0=10, d1=5, t0=40, t1=20, a0=12, a1=3, p0=7, p1=5, q0=2, q1=1, g=100)), 1.0)
    after = read_snapshot(parse(vllm_text(d0=18, d1=9, t0=72, t1=36, a0=22, a1=9, p0=12, p1=9, q0=5, q1=3, g=160)), 3.0)
    assert after.server == VLLM and after.speculates and after.accepted_per_position == (17, 12)
    stats = spec_between(before, after)  # 12 drafts, 48 drafted, 16 accepted since
    assert (stats["speculative_steps"], stats["drafted"], stats["accepted"]) == (12, 48, 16)
    assert stats["acceptance_rate"] == pytest.approx(16 / 48)
    assert stats["mean_acceptance_length"] == pytest.approx(1 + 16 / 12)  # vLLM's: the bonus token counted
    assert stats["per_position_acceptance"] == pytest.approx([8 / 12, 6 / 12])
    assert tokens_per_second(before, after) == pytest.approx(30.0)
    idle = spec_between(after, after)  # nothing drafted in between: n/a, not 0
    assert idle["acceptance_rate"] is None and idle["mean_acceptance_length"] is None


def test_a_counter_reset_reads_as_a_restart() -> None:
    before = read_snapshot(
        parse(vllm_text(d0=100, d1=0, t0=400, t1=0, a0=200, a1=0, p0=1, p1=1, q0=0, q1=0, g=900)), 1.0
    )
    after = read_snapshot(parse(vllm_text(d0=4, d1=0, t0=16, t1=0, a0=8, a1=0, p0=4, p1=3, q0=0, q1=0, g=12)), 2.0)
    stats = spec_between(before, after)
    assert (stats["speculative_steps"], stats["accepted"]) == (4, 8) and stats["mean_acceptance_length"] == 3.0
    assert tokens_per_second(before, after) == 12.0


def test_vllm_without_speculation_has_no_figures() -> None:
    m = parse('vllm:generation_tokens_total{engine="0",model_name="m"} 5.0\n')
    snapshot = read_snapshot(m, 1.0)
    assert server_kind(m) == VLLM and not snapshot.speculates and spec_between(None, snapshot) is None


def test_sglang_gauges_per_rank() -> None:
    text = "\n".join(
        [
            "# TYPE sglang:spec_accept_length gauge",
            'sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="m",tp_rank="0"} 3.2',
            'sglang:spec_accept_length{dp_rank="1",engine_type="unified",model_name="m",tp_rank="0"} 2.8',
            'sglang:spec_accept_length{dp_rank="2",engine_type="unified",model_name="m",tp_rank="0"} 0.0',
            'sglang:spec_accept_rate{dp_rank="0",engine_type="unified",model_name="m",tp_rank="0"} 0.55',
            'sglang:generation_tokens_total{engine_type="unified",model_name="m"} 1234.0',
        ]
    )
    snapshot = read_snapshot(parse(text), 1.0)
    assert snapshot.server == SGLANG and snapshot.speculates
    stats = spec_between(None, snapshot)
    assert stats["mean_acceptance_length"] == pytest.approx(3.0)  # the ranks that report (a 0 has none)
    assert stats["acceptance_rate"] == 0.55 and stats["drafted"] is None and stats["per_position_acceptance"] == []
    stale = spec_between(snapshot, read_snapshot(parse(text), 2.0))  # nothing generated since: old gauges
    assert stale["mean_acceptance_length"] is None and stale["acceptance_rate"] is None
    quiet = read_snapshot(parse('sglang:spec_accept_length{tp_rank="0"} 0.0\n'), 1.0)
    assert not quiet.speculates and spec_between(None, quiet) is None  # SGLang without speculation


def test_flashdesk_counters() -> None:
    def text(steps, drafted, accepted, emitted, generated):
        return (
            f"flashdesk_spec_steps_total {steps}\nflashdesk_spec_draft_tokens_total {drafted}\n"
            f"flashdesk_spec_accepted_tokens_total {accepted}\nflashdesk_spec_emitted_tokens_total {emitted}\n"
            f"flashdesk_generation_tokens_total {generated}\nflashdesk_requests_total 1\n"
        )

    before = read_snapshot(parse(text(2, 30, 10, 12, 13)), 0.0)
    after = read_snapshot(parse(text(6, 90, 31, 36, 40)), 0.5)
    assert after.server == FLASHDESK
    stats = spec_between(before, after)
    assert stats["mean_acceptance_length"] == pytest.approx(24 / 4)  # emitted / steps, as the engine's summary
    assert stats["acceptance_rate"] == pytest.approx(21 / 60)
    assert tokens_per_second(before, after) == pytest.approx(54.0)


def test_metrics_of_another_kind_have_no_figures() -> None:
    snapshot = read_snapshot(parse("process_cpu_seconds_total 1.5\n"), 1.0)
    assert snapshot.server is None and spec_between(None, snapshot) is None
    assert tokens_per_second(None, snapshot) is None


# -- addresses, requests, events, chunks ----------------------------------------------------------------


@pytest.mark.parametrize(
    "typed, root",
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
        ("127.0.0.1:30000", "http://127.0.0.1:30000"),
        ("https://gpu.example.org/proxy/v1", "https://gpu.example.org/proxy"),
    ],
)
def test_server_address(typed: str, root: str) -> None:
    address = server_address(typed)
    assert address.root == root and address.api == root + "/v1" and address.metrics == root + "/metrics"


@pytest.mark.parametrize("typed", ["", "ftp://host/v1", "http://:8000", "http://host:port/v1"])
def test_server_address_refuses_what_is_not_one(typed: str) -> None:
    with pytest.raises(ValueError):
        server_address(typed)


def test_chat_body() -> None:
    msg = p.Generate(
        "r",
        [{"role": "user", "content": "hi"}],
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=3,
        max_tokens=77,
        thinking=True,
    )
    body = chat_body(msg, "m")
    assert body["model"] == "m" and body["stream"] and body["stream_options"] == {"include_usage": True}
    sampling = (body["max_tokens"], body["temperature"], body["top_p"], body["top_k"], body["seed"])
    assert sampling == (77, 0.7, 0.9, 40, 3)
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and "ignore_eos" not in body
    plain = chat_body(p.Generate("r", [{"role": "user", "content": "hi"}]), "m")
    assert "top_k" not in plain and "seed" not in plain and plain["chat_template_kwargs"] == {"enable_thinking": False}


def test_server_sent_events() -> None:
    events = SseEvents()
    lines = [": keep-alive", 'data: {"a": 1}', "", "event: message", 'data:{"b":', "data: 2}", "", "data: [DONE]"]
    got = [d for d in (events.feed(line) for line in lines) if d is not None]
    assert got == ['{"a": 1}', '{"b":\n2}'] and events.flush() == "[DONE]" and events.flush() is None


def test_chunk_parts() -> None:
    delta = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    assert chunk_parts(delta) == ChunkParts("Hi")
    assert chunk_parts({"choices": [{"delta": {"reasoning_content": "hm"}}]}).reasoning == "hm"
    assert chunk_parts({"choices": [{"delta": {"reasoning": "hm"}}]}).reasoning == "hm"  # vLLM >= 0.19
    end = chunk_parts({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    assert end.usage == {"prompt_tokens": 5, "completion_tokens": 9} and end.content == ""
    whole = chunk_parts({"choices": [{"message": {"content": "All"}, "finish_reason": "length"}]})
    assert (whole.content, whole.finish_reason) == ("All", "length")
    assert chunk_parts({"error": {"message": "CUDA out of memory", "code": 500}}).error == "CUDA out of memory"


# -- errors in words ------------------------------------------------------------------------------------------


def test_server_messages() -> None:
    assert (
        server_message('{"error": {"message": "The model `x` does not exist.", "code": 404}}')
        == "The model `x` does not exist."
    )
    assert server_message('{"object": "error", "message": "bad top_p"}') == "bad top_p"
    assert server_message('{"detail": "Not authenticated"}') == "Not authenticated"
    assert server_message('{"error": "Unauthorized"}') == "Unauthorized"
    assert server_message("<html>\n  Bad Gateway </html>") == "<html> Bad Gateway </html>"


def test_status_sentences() -> None:
    a = server_address("http://10.0.0.5:8000/v1")
    assert "refused the API key (HTTP 401: Unauthorized)" in status_sentence(
        401, '{"error": "Unauthorized"}', a, "/v1/models", None, True
    )
    assert "asks for an API key (HTTP 401)" in status_sentence(401, "", a, "/v1/models", None, False)
    missing = status_sentence(
        404, '{"error": {"message": "The model `g` does not exist."}}', a, "/v1/chat/completions", "g", True
    )
    assert "has no model 'g' (HTTP 404" in missing and "Check" in missing
    assert "has no /v1/models (HTTP 404)" in status_sentence(404, "Not Found", a, "/v1/models", None, False)
    assert (
        status_sentence(400, '{"message": "max_tokens is too large"}', a, "x", None, False)
        == "The server refused the request (HTTP 400: max_tokens is too large)."
    )
    assert "failed (HTTP 503" in status_sentence(503, "", a, "x", None, False)


def test_connection_sentences() -> None:
    a = server_address("http://127.0.0.1:1/v1")
    try:
        raise httpx.ConnectError("All connection attempts failed") from ConnectionRefusedError(111, "refused")
    except httpx.ConnectError as exc:
        assert "the connection was refused" in connection_sentence(exc, a)
    assert "no answer within" in connection_sentence(httpx.ConnectTimeout("timed out"), a)
    assert "sent nothing for too long" in connection_sentence(httpx.ReadTimeout("read"), a)
    assert "closed the connection before the answer ended" in connection_sentence(
        httpx.RemoteProtocolError("peer closed"), a
    )


# -- a stream as protocol messages -------------------------------------------------------------------------


def test_stream_steps_count_chunks_and_correct_by_the_usage() -> None:
    s = StreamSteps("r", sent_at=100.0)
    assert s.started() == p.Started("r", 0)
    assert s.add(ChunkParts(""), 100.1) is None  # the role chunk
    first = s.add(ChunkParts(reasoning="Let me "), 100.5, {"mean_acceptance_length": 2.0})
    assert (first.index, first.seconds, first.elapsed, first.thought, len(first.emitted)) == (0, 0.5, 0.5, "Let me ", 1)
    assert first.stats == {"mean_acceptance_length": 2.0}
    second = s.add(ChunkParts("Hello"), 100.6)
    assert (second.index, second.seconds, second.answer) == (1, 0.0, "Hello")
    s.add(ChunkParts(" world", finish_reason="stop"), 100.7)
    assert s.add(ChunkParts(usage={"prompt_tokens": 12, "completion_tokens": 9}), 101.5) is None
    *steps, finished = s.finish(101.6, {"mean_acceptance_length": 3.0})
    assert len(steps) == 1 and len(steps[0].emitted) == 6 and steps[0].elapsed == pytest.approx(0.7)
    assert (finished.reason, finished.text, finished.thought) == ("stop", "Hello world", "Let me ")
    assert finished.last_step == 3
    assert finished.prompt_tokens == 0 and "reused_tokens" not in finished.stats  # the server said nothing of reuse
    assert finished.stats["mean_acceptance_length"] == 3.0 and finished.elapsed == pytest.approx(1.6)


def test_stream_steps_with_usage_on_every_chunk_and_cached_tokens() -> None:
    s = StreamSteps("r", sent_at=0.0)
    a = s.add(ChunkParts("ab", usage={"completion_tokens": 3}), 1.0)
    b = s.add(ChunkParts("cd", usage={"completion_tokens": 7}), 2.0)
    assert (len(a.emitted), len(b.emitted)) == (3, 4)  # the server's own count, chunk by chunk
    s.add(
        ChunkParts(
            finish_reason="length",
            usage={"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 32}},
        ),
        2.1,
    )
    (finished,) = s.finish(2.2, None)
    assert finished.reason == "length" and finished.prompt_tokens == 50
    assert (finished.stats["reused_tokens"], finished.stats["prefill_tokens"]) == (32, 18)


def test_a_cancelled_stream_keeps_its_text() -> None:
    s = StreamSteps("r", sent_at=0.0)
    s.add(ChunkParts("Part"), 0.2)
    (finished,) = s.finish(0.3, None, reason="cancelled")
    assert (finished.reason, finished.text) == ("cancelled", "Part")


def test_a_server_that_answers_whole_gives_one_chunk() -> None:
    """A server that ignores stream=true and sends the whole completion as JSON still gives its reply."""
    import asyncio

    from flashdesk.app.backends.openai_client import OpenAIServer

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions" and request.headers["authorization"] == "Bearer k"
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "Whole", "reasoning_content": "hm"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            },
        )

    async def run() -> list[ChunkParts]:
        server = OpenAIServer(server_address("http://gpu:8000/v1"), "k")
        server.client = httpx.AsyncClient(transport=httpx.MockTransport(answer), headers=server.client.headers)
        try:
            return [parts async for parts in server.stream_chat({"model": "m", "stream": True})]
        finally:
            await server.aclose()

    (parts,) = asyncio.run(run())
    assert (parts.content, parts.reasoning, parts.finish_reason, parts.usage["completion_tokens"]) == (
        "Whole",
        "hm",
        "stop",
        2,
    )
