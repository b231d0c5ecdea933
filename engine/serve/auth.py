"""Who may use the server: loopback needs no key; any other address needs one, on every route but /health.

Why refuse rather than warn: a server on 0.0.0.0 without a key hands the GPU (and whatever the
conversations hold) to anyone on the network, and a warning scrolls away. Only literal loopback
addresses and "localhost" count as loopback; a host name could resolve anywhere.
"""

from __future__ import annotations

import hmac
import ipaddress

from flashdesk.engine.serve.errors import ApiError, ServeError

OPEN_PATHS = frozenset({"/health"})  # what a load balancer or the app may ask without the key


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
    """ASGI middleware: `Authorization: Bearer KEY` on every HTTP route but OPEN_PATHS, else a 401.

    Plain ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer streamed responses
    and hide client disconnects from them."""

    def __init__(self, app, api_key: str):
        self.app, self.key = app, api_key.encode()

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
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                await ApiError(401, "the API key is wrong", code="invalid_api_key").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
