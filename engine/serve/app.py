"""The OpenAI-compatible HTTP API over a Runner: GET /v1/models, POST /v1/chat/completions and
POST /v1/completions (streamed or whole), GET /health and GET /metrics.

Around the routes, outermost first: the Host check (hosts.py), CORS (cors.py), the API key
(auth.py), and the body gate (body.py: JSON only, bounded in size and time). A chat request then
takes a place in the bounded queue (a 429 when there is none), is checked here (schema, model
name, max_tokens against the context), gets its prompt made off the event loop and the engine's
thread (prompt.py, which refuses what cannot fit), and is queued on the runner as a Job, so every
refusal is a plain 4xx before any response header is sent. A client that goes away cancels its job:
the streaming generator's cleanup does it (Starlette cancels the stream when the client
disconnects), and a whole-reply request watches for the disconnect while it waits. The time limit
per request cancels it too: a reply that has begun ends there (finish_reason "length"), one still
waiting gets a 503.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from flashdesk.engine.decode.turn import CANCELLED
from flashdesk.engine.serve.auth import ANONYMOUS, CLIENT_SCOPE, BearerAuth, parse_keys
from flashdesk.engine.serve.body import BodyGate
from flashdesk.engine.serve.bridge import GONE, EventBridge
from flashdesk.engine.serve.completion import DONE, Completion, event
from flashdesk.engine.serve.cors import Cors
from flashdesk.engine.serve.errors import ApiError, install_error_handlers
from flashdesk.engine.serve.hosts import HostCheck, allowed_hosts
from flashdesk.engine.serve.limits import Admission, Limits
from flashdesk.engine.serve.metrics import CONTENT_TYPE
from flashdesk.engine.serve.prompt import PromptMaker
from flashdesk.engine.serve.runner import CLIENT_GONE, STOPPING, Job, JobDelta, JobDone, JobFailed, JobStarted, Runner
from flashdesk.engine.serve.schema import ChatCompletionRequest
from flashdesk.engine.serve.tool_reply import ToolReply
from flashdesk.engine.serve.tools import Plan, Structure, template_messages
from flashdesk.engine.serve.text_job import sampling_for, text_job
from flashdesk.engine.serve.text_schema import CompletionRequest

OWNER = "flashdesk"
EXPIRED = object()  # the request's time limit passed (on the job's event queue)


def create_app(
    runner: Runner,
    model: str,
    api_key: str | None = None,
    sampling_defaults: dict | None = None,
    *,
    limits: Limits = Limits(),
    hosts: frozenset[str] | None = None,
    cors_origins: frozenset[str] = frozenset(),
) -> FastAPI:
    """The API for `runner`'s engine, serving it as `model`. `sampling_defaults` (the model's
    generation_config) fill the sampling fields a request leaves out; `api_key`: one key or a comma
    list, required on every route but /health; `hosts`: the Host names answered (hosts.py; None: the
    loopback names); `cors_origins`: the web origins that may call it from a browser (cors.py)."""
    app = FastAPI(title="FlashDesk", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(BodyGate, max_bytes=limits.max_body_bytes, seconds=limits.body_seconds)
    keys = parse_keys(api_key)
    if keys:  # outside the body gate: nothing is read before the key is checked
        app.add_middleware(BearerAuth, api_keys=keys)
    app.add_middleware(Cors, origins=cors_origins)  # a preflight carries no key
    app.add_middleware(HostCheck, allowed=hosts if hosts is not None else allowed_hosts("127.0.0.1"))
    created = int(time.time())
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    defaults.update(sampling_defaults or {})
    tokenizer = getattr(runner, "tokenizer", None)
    prompts = PromptMaker(tokenizer, runner.context_limit) if tokenizer is not None else None
    structure = Structure(tokenizer) if tokenizer is not None else None  # tools and response formats
    admission = Admission(limits.max_queue)
    app.state.prompts = prompts

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

    def plan_for(body: ChatCompletionRequest) -> Plan:
        """What the request's tools and response format ask of the engine (a 400 when it cannot)."""
        if structure is None:
            if body.tools or body.response_format not in (None, {"type": "text"}):
                raise ApiError(400, "this model has no tokenizer: no tools or response formats", "tools")
            return Plan()
        return structure.plan(body)

    async def job_for(body: ChatCompletionRequest, scope: str, plan: Plan) -> Job:
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
        sampling = sampling_for(body, defaults, plan.suppress)
        messages = template_messages(body.chat_messages())
        fitted = None
        if prompts is not None:
            started = time.monotonic()
            try:
                fitted = await prompts.fit(messages, body.thinking, max_tokens, plan.tools)
            except ApiError as exc:
                runner.refused(exc.message, body.stream, time.monotonic() - started)
                raise
        return Job(
            messages,
            sampling,
            fitted.max_new_tokens if fitted is not None else max_tokens or limit,
            body.thinking,
            body.stop_strings,
            body.ignore_eos,
            body.stream,
            fitted=fitted,
            scope=scope,
            logprobs=(body.top_logprobs or 0) if body.logprobs else None,
            grammar=plan.grammar,
            stop_ids=plan.stop_ids,
            marks=plan.calls,
        )

    def admit():
        """A place in the bounded queue, or a 429."""
        place = admission.enter()
        if place is None:
            raise ApiError(
                429,
                f"the server is busy: {limits.max_queue} requests are already queued; try again shortly",
                code="queue_full",
                type_="rate_limit_error",
                headers={"Retry-After": str(admission.retry_after())},
            )
        return place

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        place = admit()
        try:  # a schema's grammar may take seconds to build: off the loop that serves every client
            plan = await asyncio.get_running_loop().run_in_executor(None, plan_for, body)
            job = await job_for(body, request.scope.get(CLIENT_SCOPE, ANONYMOUS), plan)
        except BaseException:
            place.leave()
            raise
        plain = Completion(job.id, int(time.time()), model, logprobs=bool(body.logprobs))
        completion = ToolReply(plain) if plan.calls else plain
        return await _answer(runner, job, body, request, completion, limits, place)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        place = admit()
        try:
            scope = request.scope.get(CLIENT_SCOPE, ANONYMOUS)
            job, completion = await text_job(body, runner, prompts, defaults, model, scope)
        except BaseException:
            place.leave()
            raise
        return await _answer(runner, job, body, request, completion, limits, place)

    return app


async def _answer(
    runner: Runner,
    job: Job,
    body: ChatCompletionRequest | CompletionRequest,
    request: Request,
    completion,
    limits,
    place,
) -> Response:
    """Queue the job and answer with its reply (streamed or whole) or its refusal. The place in the
    queue is left when the answer is whole, or when a stream or its job ends, whichever comes first."""
    if limits.request_seconds and place.seconds() >= limits.request_seconds:  # its prompt took all the time
        place.leave()
        return _timed_out(limits).response()
    loop = asyncio.get_running_loop()
    bridge = EventBridge()
    timer = None
    if limits.request_seconds:

        def expire() -> None:
            job.cancel(timed_out=True)
            bridge.put(EXPIRED)

        timer = loop.call_later(max(0.0, limits.request_seconds - place.seconds()), expire)

    def ended() -> None:  # any thread
        place.leave()
        if timer is not None:
            try:
                loop.call_soon_threadsafe(timer.cancel)
            except RuntimeError:  # the event loop is closed: the server stopped, the timer with it
                pass

    def sink(item) -> None:  # the engine thread
        bridge.put(item)
        if isinstance(item, (JobDone, JobFailed)):
            ended()

    job.sink = sink
    bridge.watch(request)
    runner.submit(job)
    streaming = False
    try:
        first = await bridge.get()
        if first is EXPIRED:
            return _timed_out(limits).response()
        if isinstance(first, JobStarted) and body.stream:
            bridge.unwatch()  # from here Starlette watches the client of the stream
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            streaming = True
            return StreamingResponse(
                _stream(job, bridge, completion, include_usage, ended),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _whole(job, bridge, first, completion)
    except BaseException:
        job.cancel()  # the server is shutting down (the task was cancelled)
        raise
    finally:
        bridge.unwatch()
        if not streaming:
            ended()


def _timed_out(limits: Limits) -> ApiError:
    return ApiError(
        STOPPING,
        f"the request did not reach the engine within the server's time limit of {limits.request_seconds:g} "
        "seconds: the server is busy",
        code="request_timeout",
        headers={"Retry-After": "5"},
    )


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
    logprobs: list[dict] = []
    prompt_logprobs = None
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
            logprobs += item.logprobs
            prompt_logprobs = item.prompt_logprobs if item.prompt_logprobs is not None else prompt_logprobs
        elif isinstance(item, JobDone):
            reply = completion.whole(
                "".join(content), "".join(reasoning), item.reason, item.usage, logprobs, prompt_logprobs
            )
            return JSONResponse(reply)
        item = await bridge.get()  # EXPIRED: the job stops after its step, and ends as TIME_LIMIT


async def _stream(job: Job, bridge: EventBridge, completion: Completion, include_usage: bool, ended):
    """The chunks: the role first, a chunk per step with text, the finish reason, the usage, [DONE].
    Closed early (the client disconnected), it cancels the job. `ended()` when it ends, either way."""
    done = False
    try:
        opening = completion.opening(include_usage)
        if opening:
            yield opening
        while True:
            item = await bridge.get()
            if item is GONE:
                return
            if item is EXPIRED:  # the job stops after its step, and ends as TIME_LIMIT
                continue
            if isinstance(item, JobDelta):
                chunk = completion.delta(item, include_usage)
                if chunk:
                    yield chunk
                continue
            done = True  # the job is over: nothing to cancel from here on
            if _ended_badly(item):  # the engine failed, or the server is stopping: OpenAI streams an error
                yield event(_error(item).body())
            else:
                yield completion.closing(item.reason, include_usage)
                if include_usage:
                    yield completion.usage_chunk(item.usage)
            yield DONE
            return
    finally:
        if not done:
            job.cancel()
        ended()
