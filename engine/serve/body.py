"""A request's body, read here before the API sees it: JSON only, at most a size, within a time.

Why one place reads it: the API needs the whole body anyway (it is one JSON object), and reading it
here lets each way a body can go wrong get its own answer in OpenAI's error shape before anything
else runs: not JSON (415; a form a web page could send without asking is never read as JSON), too
large (413, by its Content-Length or once the bytes sent in chunks pass the limit), too slow (408,
so a client sending a byte now and then cannot hold the connection). The body is then handed on
as one message, and the connection's later messages (the client's disconnect) pass through.
"""

from __future__ import annotations

import asyncio

from flashdesk.engine.serve.errors import ApiError

WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPES = ("application/json",)


def is_json(content_type: bytes) -> bool:
    """`application/json`, with or without parameters (`; charset=utf-8`)."""
    return content_type.split(b";", 1)[0].strip().lower().decode("latin-1") in JSON_TYPES


class BodyGate:
    """ASGI middleware: reads POST bodies whole (JSON, at most `max_bytes`, within `seconds`)."""

    def __init__(self, app, max_bytes: int, seconds: float):
        self.app, self.max_bytes, self.seconds = app, max_bytes, seconds

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await _refuse(scope, send, 413, self._too_large(f"{int(length)} bytes"), "body_too_large")
            return
        if not is_json(headers.get(b"content-type", b"")):
            await _refuse(
                scope,
                send,
                415,
                "the request body must be JSON, sent with the header Content-Type: application/json",
                "unsupported_media_type",
            )
            return
        try:
            body, rest = await asyncio.wait_for(self._read(receive), self.seconds or None)
        except asyncio.TimeoutError:
            text = f"the request body did not arrive within {self.seconds:g} seconds"
            await _refuse(scope, send, 408, text, "request_timeout")
            return
        except _TooLarge:
            await _refuse(scope, send, 413, self._too_large(f"over {self.max_bytes} bytes"), "body_too_large")
            return
        if rest is not None:  # the client left while sending: nobody reads an answer
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self, size: str) -> str:
        return f"the request body is {size}, over the limit of {self.max_bytes} bytes"

    async def _read(self, receive) -> tuple[bytes, dict | None]:
        """The whole body, and the disconnect message if the client left before it was sent."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


class _TooLarge(Exception):
    pass


async def _refuse(scope, send, status: int, text: str, code: str) -> None:
    """Answer with an error and close the connection: the rest of an unread body never has to arrive."""
    response = ApiError(status, text, code=code).response()
    response.headers["Connection"] = "close"
    await response(scope, _nothing, send)


async def _nothing() -> dict:
    return {"type": "http.disconnect"}
