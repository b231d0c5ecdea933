"""A local stand-in for an OpenAI-compatible server speculating as vLLM or SGLang does, for the app's tests.

It speaks the parts of the API the app uses (GET /v1/models; POST /v1/chat/completions, streamed as
server-sent events or whole, with usage; an API key when given one) and serves /metrics in
vLLM's or SGLang's names (`metrics="vllm"`, `"sglang"`, or None for a server without /metrics).
Each reply is a fixed text cut into word tokens and emitted in speculative steps that draft
DRAFT_LENGTH tokens and accept ACCEPTED[i % len] of them; the counters move as each step streams, so
a test knows the exact acceptance the app must show (`expected_*`). With thinking asked for, a
fixed thought streams first as `reasoning_content` (no drafting). `step_delay` slows the steps so a
test can stop a reply midway; a client that leaves is counted in `aborted`.

It runs uvicorn on a free loopback port in a background thread: `with FakeOpenAIServer(...) as server`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

MODEL = "google/gemma-4-26B-A4B-it"
REPLY = (
    "Speculative decoding drafts a block of tokens with a small model and checks them all in one pass of "
    "the large one, so the text stays the same and only the speed changes."
)
THOUGHT = "The user greets me; a short friendly answer about speculation will do."
DRAFT_LENGTH = 4
ACCEPTED = (2, 0, 3, 1, 4, 1)


def words(text: str) -> list[str]:
    """The text as word tokens, each with its leading space: they join back to the text."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out.append(word if i == 0 else " " + word)
    return out


def steps_of(tokens: list[str]) -> list[list[str]]:
    """The tokens in speculative steps: step i emits ACCEPTED[i % len] + 1 tokens (fewer at the end)."""
    steps, i, k = [], 0, 0
    while i < len(tokens):
        n = ACCEPTED[k % len(ACCEPTED)] + 1
        steps.append(tokens[i : i + n])
        i, k = i + n, k + 1
    return steps


class FakeOpenAIServer:
    def __init__(
        self,
        metrics: str | None = "vllm",
        api_key: str | None = None,
        step_delay: float = 0.0,
        reply: str = REPLY,
        max_model_len: int = 8192,
    ):
        self.metrics = metrics
        self.api_key = api_key
        self.step_delay = step_delay
        self.reply = reply
        self.max_model_len = max_model_len
        self.drafts = self.draft_tokens = self.accepted = self.generation_tokens = self.prompt_tokens = 0
        self.per_position = [0] * DRAFT_LENGTH
        self.sglang_length = self.sglang_rate = 0.0
        self.requests: list[dict] = []  # the chat request bodies
        self.aborted = 0  # streams the client left before the end
        self.completed = 0
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._build()

    # -- what a test expects ------------------------------------------------------------------------

    def expected(self, reply: str | None = None) -> dict:
        """The acceptance a whole reply of `reply` gives: the figures the app must show."""
        steps = steps_of(words(reply or self.reply))
        accepted = [len(s) - 1 for s in steps]
        return {
            "steps": len(steps),
            "tokens": sum(len(s) for s in steps),
            "accepted": sum(accepted),
            "drafted": DRAFT_LENGTH * len(steps),
            "tau": 1 + sum(accepted) / len(steps),
            "rate": sum(accepted) / (DRAFT_LENGTH * len(steps)),
            "per_position": [sum(a > p for a in accepted) / len(steps) for p in range(DRAFT_LENGTH)],
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- life ---------------------------------------------------------------------------------------

    def start(self) -> "FakeOpenAIServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True, name="fake-openai-server"
        )
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    # -- the API ------------------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI()

        def refused(request: Request) -> JSONResponse | None:
            if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)  # vLLM's words
            return None

        @app.get("/v1/models")
        async def models(request: Request):
            if (answer := refused(request)) is not None:
                return answer
            return {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}],
            }

        @app.get("/metrics")
        async def metrics():
            if self.metrics is None:
                return PlainTextResponse("Not Found", status_code=404)
            return PlainTextResponse(self._metrics_text())

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            if (answer := refused(request)) is not None:
                return answer
            body = await request.json()
            self.requests.append(body)
            if body.get("model") != MODEL:
                return JSONResponse(
                    {
                        "error": {
                            "message": f"The model `{body.get('model')}` does not exist.",
                            "type": "NotFoundError",
                            "param": "model",
                            "code": 404,
                        }
                    },
                    status_code=404,
                )
            thinking = bool((body.get("chat_template_kwargs") or {}).get("enable_thinking"))
            prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
            if body.get("stream"):
                return StreamingResponse(self._stream(body, thinking, prompt), media_type="text/event-stream")
            text = "".join(words(self.reply))
            self._count_steps(steps_of(words(self.reply)), prompt)
            message = {"role": "assistant", "content": text}
            if thinking:
                message["reasoning_content"] = THOUGHT
            tokens = len(words(self.reply)) + (len(words(THOUGHT)) if thinking else 0)
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens},
            }

        return app

    def _count_steps(self, steps: list[list[str]], prompt: int) -> None:
        self.prompt_tokens += prompt
        for step in steps:
            self._count(step)

    def _count(self, step: list[str]) -> None:
        """One speculative step's counters, as vLLM and SGLang keep them."""
        accepted = len(step) - 1
        self.drafts += 1
        self.draft_tokens += DRAFT_LENGTH
        self.accepted += accepted
        for p in range(accepted):
            self.per_position[p] += 1
        self.generation_tokens += len(step)
        self.sglang_length = 1 + self.accepted / self.drafts
        self.sglang_rate = self.accepted / self.draft_tokens

    async def _stream(self, body: dict, thinking: bool, prompt: int):
        def event(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> str:
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": MODEL,
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if usage is not None:
                chunk["usage"] = usage
            return f"data: {json.dumps(chunk)}\n\n"

        limit = int(body.get("max_tokens") or 1 << 30)
        made, finish = 0, "stop"
        ended = False
        self.prompt_tokens += prompt
        try:
            yield event({"role": "assistant", "content": ""})
            if thinking:
                for token in words(THOUGHT):
                    await asyncio.sleep(self.step_delay)
                    self.generation_tokens += 1
                    made += 1
                    yield event({"reasoning_content": token})
            for step in steps_of(words(self.reply)):
                if made >= limit:
                    finish = "length"
                    break
                step = step[: limit - made]
                await asyncio.sleep(self.step_delay)
                self._count(step)
                made += len(step)
                yield event({"content": "".join(step)})
            yield event({}, finish)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event(
                    None, usage={"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}
                )
            yield "data: [DONE]\n\n"
            ended = True
        finally:
            if ended:
                self.completed += 1
            else:
                self.aborted += 1

    def _metrics_text(self) -> str:
        labels = f'model_name="{MODEL}"'
        if self.metrics == "vllm":
            lines = []
            for name, value in (
                ("spec_decode_num_drafts", self.drafts),
                ("spec_decode_num_draft_tokens", self.draft_tokens),
                ("spec_decode_num_accepted_tokens", self.accepted),
                ("generation_tokens", self.generation_tokens),
                ("prompt_tokens", self.prompt_tokens),
            ):
                lines += [
                    f"# HELP vllm:{name} Number of {name}.",
                    f"# TYPE vllm:{name} counter",
                    f'vllm:{name}_total{{engine="0",{labels}}} {float(value)}',
                    f'vllm:{name}_created{{engine="0",{labels}}} 1.7e+09',
                ]
            lines += [
                "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",{labels},position="{p}"}} {float(v)}'
                for p, v in enumerate(self.per_position)
            ]
            return "\n".join(lines) + "\n"
        rank = f'dp_rank="0",engine_type="unified",{labels},tp_rank="0"'
        return (
            "\n".join(
                [
                    "# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.",
                    "# TYPE sglang:spec_accept_length gauge",
                    f"sglang:spec_accept_length{{{rank}}} {self.sglang_length}",
                    "# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.",
                    "# TYPE sglang:spec_accept_rate gauge",
                    f"sglang:spec_accept_rate{{{rank}}} {self.sglang_rate}",
                    "# TYPE sglang:generation_tokens counter",
                    f'sglang:generation_tokens_total{{engine_type="unified",{labels}}} {float(self.generation_tokens)}',
                    "# TYPE sglang:prompt_tokens counter",
                    f'sglang:prompt_tokens_total{{engine_type="unified",{labels}}} {float(self.prompt_tokens)}',
                ]
            )
            + "\n"
        )
