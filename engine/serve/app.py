"""The OpenAI-compatible HTTP API over a Runner: GET /v1/models, POST /v1/chat/completions (streamed or
whole), GET /health and GET /metrics.

A request is checked here (schema, model name, max_tokens against the context), then queued on
the runner as a Job; everything that needs the tokenizer (the prompt, the context fit) happens on
the engine's thread, and its refusals come back as the job's first event, before any response
header is sent, so they too are plain 4xx errors. A client that goes away cancels its job: the
streaming generator's cleanup does it (Starlette cancels the stream when the client disconnects),
and a whole-reply request watches for the disconnect while it waits.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.turn import CANCELLED
from flashdesk.engine.serve.auth import BearerAuth
from flashdesk.engine.serve.bridge import GONE, EventBridge
from flashdesk.engine.serve.completion import DONE, Completion, event
from flashdesk.engine.serve.errors import ApiError, BodyLimit, install_error_handlers
from flashdesk.engine.serve.metrics import CONTENT_TYPE
from flashdesk.engine.serve.runner import CLIENT_GONE, STOPPING, Job, JobDelta, JobDone, JobFailed, JobStarted, Runner
from flashdesk.engine.serve.schema import ChatCompletionRequest

OWNER = "flashdesk"
MAX_BODY_BYTES = 16 << 20  # far over any context's worth of text; a bigger body gets a 413, not the memory


def create_app(
    runner: Runner, model: str, api_key: str | None = None, sampling_defaults: dict | None = None
) -> FastAPI:
    """The API for `runner`'s engine, serving it as `model`. `sampling_defaults` (the model's
    generation_config) fill the sampling fields a request leaves out; `api_key`: required on every
    route but /health."""
    app = FastAPI(
        title="FlashDesk",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        strict_content_type=False,
        max_body_size=MAX_BODY_BYTES,
    )  # no Content-Type: read as JSON
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    if api_key:  # the outermost: nothing is read before the key is checked
        app.add_middleware(BearerAuth, api_key=api_key)
    created = int(time.time())
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, **(sampling_defaults or {})}

    def model_card() -> dict:
        return {
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": OWNER,
            "max_model_len": runner.context_limit,
        }

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(runner.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str) -> dict:
        if name != model:
            raise ApiError(
                404, f"the model {name!r} does not exist: this server serves {model!r}", "model", "model_not_found"
            )
        return model_card()

    def job_for(body: ChatCompletionRequest) -> Job:
        if body.model is not None and body.model != model:
            raise ApiError(
                404,
                f"the model {body.model!r} does not exist: this server serves {model!r}",
                "model",
                "model_not_found",
            )
        limit = runner.context_limit
        max_tokens = body.completion_limit
        if max_tokens is not None and max_tokens > limit:
            param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
            raise ApiError(
                400,
                f"{param} is {max_tokens}, more than this model's whole context of {limit} tokens",
                param,
                "context_length_exceeded",
            )
        top_k = body.top_k if body.top_k is not None else defaults["top_k"]
        sampling = SamplingParams(
            body.temperature if body.temperature is not None else defaults["temperature"],
            body.top_p if body.top_p is not None else defaults["top_p"],
            max(0, top_k),
            body.seed,
        )
        return Job(
            body.chat_messages(),
            sampling,
            max_tokens or limit,
            body.thinking,
            body.stop_strings,
            body.ignore_eos,
            body.stream,
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        job = job_for(body)
        bridge = EventBridge()
        job.sink = bridge.put
        bridge.watch(request)
        runner.submit(job)
        completion = Completion(job.id, int(time.time()), model)
        try:
            first = await bridge.get()
            if isinstance(first, JobStarted) and body.stream:
                bridge.unwatch()  # from here Starlette watches the client of the stream
                include_usage = body.stream_options is not None and body.stream_options.include_usage
                return StreamingResponse(
                    _stream(job, bridge, completion, include_usage),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            return await _whole(job, bridge, first, completion)
        except BaseException:
            job.cancel()  # the server is shutting down (the task was cancelled)
            raise
        finally:
            bridge.unwatch()

    return app


def _error(end: JobFailed | JobDone) -> ApiError:
    """A refusal, an engine failure, or a job the stopping server cancelled, as an API error."""
    if isinstance(end, JobFailed):
        return ApiError(end.status, end.message, code=end.code)
    return ApiError(STOPPING, "the request was cancelled: the server is stopping", code="server_stopping")


def _ended_badly(item) -> bool:
    return isinstance(item, JobFailed) or (isinstance(item, JobDone) and item.reason == CANCELLED)


async def _whole(job: Job, bridge: EventBridge, first, completion: Completion) -> Response:
    """Collect the reply (or the refusal, or the client's disconnect) into one response."""
    content: list[str] = []
    reasoning: list[str] = []
    item = first
    while True:
        if item is GONE:
            job.cancel()
            return Response(status_code=CLIENT_GONE)  # nobody reads it
        if _ended_badly(item):
            return _error(item).response()
        if isinstance(item, JobDelta):
            content.append(item.content)
            reasoning.append(item.reasoning)
        elif isinstance(item, JobDone):
            return JSONResponse(completion.whole("".join(content), "".join(reasoning), item.reason, item.usage))
        item = await bridge.get()


async def _stream(job: Job, bridge: EventBridge, completion: Completion, include_usage: bool):
    """The chunks: the role first, a chunk per step with text, the finish reason, the usage, [DONE].
    Closed early (the client disconnected), it cancels the job."""
    finished = False
    try:
        yield completion.chunk({"role": "assistant", "content": ""}, with_usage=include_usage)
        while True:
            item = await bridge.get()
            if item is GONE:
                return
            if isinstance(item, JobDelta):
                delta = {"reasoning_content": item.reasoning} if item.reasoning else {}
                if item.content:
                    delta["content"] = item.content
                yield completion.chunk(delta, with_usage=include_usage)
                continue
            finished = True  # the job is over: nothing to cancel from here on
            if _ended_badly(item):  # the engine failed, or the server is stopping: OpenAI streams an error
                yield event(_error(item).body())
            else:
                yield completion.chunk({}, item.reason, with_usage=include_usage)
                if include_usage:
                    yield completion.usage_chunk(item.usage)
            yield DONE
            return
    finally:
        if not finished:
            job.cancel()
