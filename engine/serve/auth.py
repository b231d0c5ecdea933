"""Who may use the server: loopback needs no key; any other address needs one, on every route but /health.

Why refuse rather than warn: a server on 0.0.0.0 without a key hands the GPU (and whatever the
conversations hold) to anyone on the network, and a warning scrolls away. Only literal loopback
addresses and "localhost" count as loopback; a host name could resolve anywhere.

Several keys (a comma list: one per person or program) keep their users apart: each key is a
scope of its own in the prefix cache, so one never reuses, nor learns the length of, a prompt
prefix another sent. Without a key every request is one scope (ANONYMOUS).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from flashdesk.engine.serve.errors import ApiError, ServeError

OPEN_PATHS = frozenset({"/health"})  # what a load balancer or the app may ask without the key
CLIENT_SCOPE = "flashdesk.scope"  # the ASGI scope's key for the request's prefix-cache scope
ANONYMOUS = "http"  # the scope of requests to a server without a key


def parse_keys(text: str | None) -> tuple[str, ...]:
    """The API keys in a comma list ("KEY" or "KEY1,KEY2"); none for None or blanks."""
    return tuple(k.strip() for k in (text or "").split(",") if k.strip())


def key_scope(key: bytes) -> str:
    """A key's prefix-cache scope: a digest, so the key itself is never kept beside the cache."""
    return "key:" + hashlib.sha256(key).hexdigest()[:16]


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse a non-loopback bind address without an API key (before anything is loaded)."""
    if not api_key and not is_loopback(host):
        raise ServeError(
            f"refusing to serve on {host} without an API key: every machine that can reach that address "
            "could use the model. Give --api-key KEY (or set FLASHDESK_API_KEY), or serve on "
            "127.0.0.1 (the default) for this computer only"
        )


class BearerAuth:
    """ASGI middleware: `Authorization: Bearer KEY` (any of `api_keys`) on every HTTP route but
    OPEN_PATHS, else a 401; the request's scope is the key's.

    Plain ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer streamed responses
    and hide client disconnects from them."""

    def __init__(self, app, api_keys: tuple[str, ...]):
        self.app, self.keys = app, [k.encode() for k in api_keys]

    def _match(self, token: bytes) -> bytes | None:
        found = None
        for key in self.keys:  # every key compared, in constant time each
            if hmac.compare_digest(token, key):
                found = key
        return found

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = header.partition(b" ")
            if not token:
                await ApiError(
                    401,
                    "this server needs an API key: send the header Authorization: Bearer KEY",
                    code="missing_api_key",
                ).response()(scope, receive, send)
                return
            key = self._match(token.strip()) if scheme.lower() == b"bearer" else None
            if key is None:
                await ApiError(401, "the API key is wrong", code="invalid_api_key").response()(scope, receive, send)
                return
            scope = {**scope, CLIENT_SCOPE: key_scope(key)}
        await self.app(scope, receive, send)
