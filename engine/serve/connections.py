"""uvicorn's HTTP protocol with a deadline for a request's headers (a connection that has not sent a
whole request line and headers within the time is answered 408 and closed), and its refusal of
what is not HTTP in OpenAI's error shape rather than plain text.

Why: uvicorn waits for headers as long as a client likes, and closes an idle connection only after a
response. Opening hundreds of connections and sending nothing (or a header a minute) would hold a
file descriptor and memory each for good. The deadline runs from the connection's start, and on a
kept-alive connection from the next request's first byte; it stops once the headers are in (the
body has its own deadline, body.py).
"""

from __future__ import annotations

import asyncio
import json

from flashdesk.engine.serve.errors import error_body


def _answer(status: str, message: str, code: str) -> bytes:
    """A whole HTTP response with OpenAI's error object, closing the connection."""
    body = json.dumps(error_body(message, code=code)).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def with_header_deadline(base: type[asyncio.Protocol], seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `base`, closing connections whose headers take over `seconds`
    (0: no deadline) and answering bytes that are not HTTP with a JSON 400.

    It needs of `base` only what both of uvicorn's HTTP/1.1 protocols have: `loop`, `transport`,
    `cycle`, the request being answered (a new one once a request's headers are parsed), and
    `send_400_response`."""

    class HeaderDeadline(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def send_400_response(self, msg: str) -> None:
            if not self.transport.is_closing():
                text = f"the request is not valid HTTP: {msg}"
                self.transport.write(_answer("400 Bad Request", text, "invalid_http"))
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self._between_requests():
                self._arm()  # the first byte of the next request on a kept-alive connection
            before = getattr(self, "cycle", None)
            super().data_received(data)
            if getattr(self, "cycle", None) is not before:  # its headers are in
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or getattr(cycle, "response_complete", False)

        def _arm(self) -> None:
            self._disarm()
            if seconds:
                self._header_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            transport = self.transport
            if transport is None or transport.is_closing() or not self._between_requests():
                return
            message = f"the request headers did not arrive within {seconds:g} seconds"
            transport.write(_answer("408 Request Timeout", message, "request_timeout"))
            transport.close()

    HeaderDeadline.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline
