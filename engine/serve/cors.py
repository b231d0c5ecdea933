"""Web pages that may call the API from a browser: none unless `--cors-origins` names them.

Why none by default: a browser lets a page read replies from another origin only when the server
says so in CORS headers, and that is what keeps pages from using a model on this machine behind its
owner's back. A page that is meant to (a local web UI) is named with its origin
(`http://localhost:3000`), or every page with `*`. The key travels in the Authorization header,
never in a cookie, so no credentials mode is needed.

A preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin gets a 204 naming the
methods and headers the API takes; from any other origin a 403 without CORS headers. Other
responses to an allowed origin carry Access-Control-Allow-Origin and Vary: Origin; to any other,
nothing is added, and the browser keeps the reply from the page.
"""

from __future__ import annotations

import re

from flashdesk.engine.serve.errors import ApiError

ANY = "*"
METHODS = "GET, POST, OPTIONS"
HEADERS = "Authorization, Content-Type"
HEADER_LIST = re.compile(rb"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*$")  # RFC 9110 tokens
EXPOSED = "Retry-After"  # a page may read how long to wait after a 429
MAX_AGE = "600"  # seconds a browser may keep a preflight's answer


def parse_origins(text: str | None) -> frozenset[str]:
    """A comma list of origins ("http://localhost:3000,https://app.example") or "*"."""
    return frozenset(_origin(o) for o in (text or "").split(",") if o.strip())


def _origin(text: str) -> str:
    text = text.strip()
    return ANY if text == ANY else text.rstrip("/").lower()


class Cors:
    """ASGI middleware: CORS headers for the allowed origins, preflights answered here."""

    def __init__(self, app, origins: frozenset[str]):
        self.app, self.origins = app, origins

    def _allowed(self, origin: bytes | None) -> bool:
        return origin is not None and (ANY in self.origins or _origin(origin.decode("latin-1")) in self.origins)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin")
        allowed: bytes | None = origin if self._allowed(origin) else None  # the origin, when it may call
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            if allowed is None:
                await ApiError(
                    403,
                    "this origin may not call the API from a browser (flashdesk serve --cors-origins allows origins)",
                    code="origin_not_allowed",
                ).response()(scope, receive, send)
                return
            asked = headers.get(b"access-control-request-headers", b"").strip()
            preflight = self._headers(allowed, preflight=asked if HEADER_LIST.match(asked) else b"")
            await send({"type": "http.response.start", "status": 204, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return
        if allowed is None:
            await self.app(scope, receive, send)
            return

        async def with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self._headers(allowed)]}
            await send(message)

        await self.app(scope, receive, with_cors)

    def _headers(self, origin: bytes, preflight: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """The CORS headers of a reply; `preflight`: the headers a preflight asked for (well-formed
        names only; the openai package in a browser adds its own x-stainless-* ones), allowed with ours."""
        out = [
            (b"access-control-allow-origin", b"*" if ANY in self.origins else origin),
            (b"vary", b"Origin"),
        ]
        if preflight is not None:
            allowed = HEADERS.encode() + (b", " + preflight if preflight else b"")
            out += [
                (b"access-control-allow-methods", METHODS.encode()),
                (b"access-control-allow-headers", allowed),
                (b"access-control-max-age", MAX_AGE.encode()),
            ]
        else:
            out.append((b"access-control-expose-headers", EXPOSED.encode()))
        return out
