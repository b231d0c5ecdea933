"""Talking to an OpenAI-compatible server (vLLM, SGLang, another FlashDesk): its address, the chat
request, the streamed answer (server-sent events), `/v1/models`, `/metrics`, and what its errors mean.

Why our own and not the `openai` package: the app needs the raw stream (the time of each chunk,
`reasoning_content`, the usage on the last chunk), a cancel that closes the connection at once,
`/metrics` (no part of the OpenAI API), and one clear sentence for each failure a desktop user
meets (a refused connection, a wrong key, a model the server does not have). httpx does the HTTP.
Qt-free: it runs on the remote session's network thread.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import AsyncIterator
from urllib.parse import urlsplit

import httpx

from flashdesk import protocol as p

CONNECT_S = 5.0
REQUEST_S = 15.0  # /v1/models and /metrics
STREAM_READ_S = 300.0  # the longest silence accepted inside a reply (a long prompt's prefill, a queue)
SETUP_HINT = "File → Model setup → Connect to a server"


class ServerError(Exception):
    """A failure as one sentence for the window; `status` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServerAddress:
    """Where the server is: `root` without the API's /v1 (where /metrics lives)."""

    root: str

    @property
    def api(self) -> str:
        return self.root + "/v1"

    @property
    def metrics(self) -> str:
        return self.root + "/metrics"

    @property
    def host(self) -> str:
        return urlsplit(self.root).netloc


def server_address(text: str) -> ServerAddress:
    """The address typed by the user, with or without the scheme and /v1 (ValueError: not an address)."""
    url = text.strip().rstrip("/")
    if not url:
        raise ValueError("Type the server's address, e.g. http://127.0.0.1:8000/v1.")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text.strip()!r} is not a server address: type it as http://HOST:PORT/v1.")
    try:
        parts.port
    except ValueError as exc:
        raise ValueError(f"{text.strip()!r} has a port that is not a number.") from exc
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return ServerAddress(f"{parts.scheme}://{parts.netloc}{path}")


def chat_body(msg: p.Generate, model: str) -> dict:
    """The streamed chat request for a Generate: sampling as asked, usage on the last chunk,
    thinking on or off through the chat template (`chat_template_kwargs`, as vLLM and SGLang take it),
    and a reply to go on with (messages ending with the assistant's) sent as vLLM asks for it."""
    body = {
        "model": model,
        "messages": msg.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": msg.max_tokens,
        "temperature": msg.temperature,
        "top_p": msg.top_p,
        "chat_template_kwargs": {"enable_thinking": bool(msg.thinking)},
    }
    if msg.top_k > 0:
        body["top_k"] = msg.top_k
    if msg.seed is not None:
        body["seed"] = msg.seed
    if msg.ignore_eos:
        body["ignore_eos"] = True
    if msg.messages and msg.messages[-1].get("role") == "assistant":  # go on with that reply (vLLM's fields)
        body["continue_final_message"], body["add_generation_prompt"] = True, False
    return body


class SseEvents:
    """Server-sent events from lines: `feed` returns an event's data when a blank line ends it."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:
            return self.flush()
        if line.startswith(":"):  # a comment (keep-alive)
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


@dataclass(frozen=True)
class ChunkParts:
    """What one streamed chunk (or a whole non-streamed answer) carries."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: dict | None = None
    error: str | None = None


def chunk_parts(chunk: dict) -> ChunkParts:
    """The text, thought, end and usage of a chunk. Thought is `reasoning_content` (vLLM before 0.19,
    SGLang, DeepSeek) or `reasoning` (vLLM since)."""
    if not isinstance(chunk, dict):
        return ChunkParts(error=f"the server sent {type(chunk).__name__} where a chunk object belongs")
    if chunk.get("error"):
        return ChunkParts(error=server_message(json.dumps(chunk)))
    choices = chunk.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta") or choice.get("message") or {}
    content = delta.get("content")
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    usage = chunk.get("usage")
    return ChunkParts(
        content if isinstance(content, str) else "",
        reasoning if isinstance(reasoning, str) else "",
        choice.get("finish_reason"),
        usage if isinstance(usage, dict) else None,
    )


def server_message(body: str) -> str:
    """The server's own words in an error body: OpenAI's {"error": {"message"}}, vLLM's
    {"message"}, FastAPI's {"detail"}, or the text itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return " ".join(body.split())[:300]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if isinstance(error, str) and error:
            return error[:300]
        if data.get("message"):
            return str(data["message"])[:300]
        if data.get("detail"):
            detail = data["detail"]
            return (detail if isinstance(detail, str) else json.dumps(detail))[:300]
    return " ".join(body.split())[:300]


def status_sentence(status: int, body: str, address: ServerAddress, path: str, model: str | None, has_key: bool) -> str:
    """What an HTTP error status means for the user, with the server's own words."""
    said = server_message(body)
    said_part = f": {said}" if said else ""
    host = address.host
    if status == 401:
        if not has_key:
            return f"The server at {host} asks for an API key (HTTP 401). Enter it in {SETUP_HINT}."
        return f"The server at {host} refused the API key (HTTP 401{said_part}). Check the key in {SETUP_HINT}."
    if status == 403:
        return f"The server at {host} refused access (HTTP 403{said_part}). Check the API key in {SETUP_HINT}."
    if status == 404:
        if model and "model" in said.lower():
            return (
                f"The server at {host} has no model {model!r} (HTTP 404{said_part}). Press Check in "
                f"{SETUP_HINT} to list the models it serves."
            )
        return (
            f"The server at {host} has no {path} (HTTP 404). Is {address.api} the address of an OpenAI-compatible API?"
        )
    if status in (400, 422):
        return f"The server refused the request (HTTP {status}{said_part})."
    if status == 429:
        return f"The server at {host} is busy (HTTP 429{said_part}). Try again in a moment."
    if status >= 500:
        return f"The server at {host} failed (HTTP {status}{said_part})."
    return f"The server at {host} answered HTTP {status}{said_part}."


def connection_sentence(exc: httpx.HTTPError, address: ServerAddress) -> str:
    """What a transport failure means: refused, unknown host, timeouts, a connection cut."""
    host = address.host
    text = str(exc)
    low = text.lower()
    if isinstance(exc, httpx.ConnectTimeout):
        return f"Could not connect to {host}: no answer within {CONNECT_S:.0f} s."
    if isinstance(exc, httpx.ConnectError):
        causes = _causes(exc)
        if any(isinstance(c, ConnectionRefusedError) for c in causes) or "refused" in low:
            return (
                f"Could not connect to {host}: the connection was refused. Is the server running, and "
                "listening on that port?"
            )
        if any(isinstance(c, socket.gaierror) for c in causes) or "name or service not known" in low:
            return f"Could not connect to {host}: the host name {urlsplit(address.root).hostname!r} is unknown."
        return f"Could not connect to {host}: {text or type(exc).__name__}."
    if isinstance(exc, httpx.ReadTimeout):
        return f"The server at {host} sent nothing for too long (timeout); the request was given up."
    if isinstance(exc, httpx.TimeoutException):
        return f"The request to {host} timed out."
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"The server at {host} closed the connection before the answer ended."
    return f"The request to {host} failed: {text or type(exc).__name__}."


def _causes(exc: BaseException) -> list[BaseException]:
    """The exceptions behind `exc` (httpx wraps the socket's own: ConnectionRefusedError, gaierror)."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


class OpenAIServer:
    """One server, one API key: the calls the app makes. Every failure is a ServerError."""

    def __init__(self, address: ServerAddress, api_key: str | None = None):
        self.address = address
        self.has_key = bool(api_key)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(REQUEST_S, connect=CONNECT_S))

    async def aclose(self) -> None:
        await self.client.aclose()

    async def models(self) -> list[dict]:
        """The models the server serves (each {"id", ...; vLLM and SGLang add "max_model_len"})."""
        try:
            response = await self.client.get(self.address.api + "/models")
        except httpx.HTTPError as exc:
            raise ServerError(connection_sentence(exc, self.address)) from exc
        if response.status_code != 200:
            raise ServerError(
                status_sentence(response.status_code, response.text, self.address, "/v1/models", None, self.has_key),
                response.status_code,
            )
        try:
            data = response.json()["data"]
            return [m for m in data if isinstance(m, dict) and m.get("id")]
        except (ValueError, KeyError, TypeError) as exc:
            raise ServerError(
                f"The server at {self.address.host} answered /v1/models with something that is "
                "not a model list: is it an OpenAI-compatible API?"
            ) from exc

    async def metrics_text(self) -> str | None:
        """The /metrics page, or None when the server has none (any answer but 200)."""
        try:
            response = await self.client.get(self.address.metrics)
        except httpx.HTTPError as exc:
            raise ServerError(connection_sentence(exc, self.address)) from exc
        return response.text if response.status_code == 200 else None

    async def stream_chat(self, body: dict) -> AsyncIterator[ChunkParts]:
        """The chunks of a streamed chat completion (one ChunkParts for a server that answers whole)."""
        timeout = httpx.Timeout(REQUEST_S, connect=CONNECT_S, read=STREAM_READ_S)
        try:
            async with self.client.stream(
                "POST", self.address.api + "/chat/completions", json=body, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", errors="replace")
                    raise ServerError(
                        status_sentence(
                            response.status_code,
                            text,
                            self.address,
                            "/v1/chat/completions",
                            body.get("model"),
                            self.has_key,
                        ),
                        response.status_code,
                    )
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    yield chunk_parts(self._json(await response.aread()))
                    return
                events = SseEvents()
                async for line in response.aiter_lines():
                    data = events.feed(line)
                    if data is None:
                        continue
                    if data.strip() == "[DONE]":
                        return
                    yield chunk_parts(self._json(data))
                data = events.flush()
                if data is not None and data.strip() != "[DONE]":
                    yield chunk_parts(self._json(data))
        except httpx.HTTPError as exc:
            raise ServerError(connection_sentence(exc, self.address)) from exc

    def _json(self, data: str | bytes):
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ServerError(
                f"The server at {self.address.host} sent something that is not JSON in its answer: {str(data)[:120]!r}"
            ) from exc
