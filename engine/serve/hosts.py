"""Which names the server answers to: the Host header must be one of this machine's, or one allowed.

Why: a web page can make a browser send requests to 127.0.0.1 under a name it controls (DNS
rebinding: its own domain, answered first with its server and then with 127.0.0.1). The browser
then treats the server as that page's own and lets it read the replies. The Host header still
carries the page's domain, so a server that answers only to its own names cannot be read that way.

Allowed by default: the loopback names (localhost, 127.0.0.1, [::1]), with or without a port.
Served on another address, that address too, and served on every address (0.0.0.0, ::) this
machine's name and its LAN addresses. `--allowed-hosts` adds more; `*` turns the check off.
"""

from __future__ import annotations

import ipaddress
import socket

from flashdesk.engine.serve.errors import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANY = "*"


def host_name(value: str) -> str:
    """A Host header (or a bind address) without its port or brackets, lower case: "[::1]:8719" -> "::1"."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        return value.split(":", 1)[0]
    return value.rstrip(".")


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def machine_names() -> set[str]:
    """This machine's name and the addresses other devices reach it at (its LAN addresses)."""
    hostname = socket.gethostname().lower()
    names = {hostname, f"{hostname}.local"}  # .local: its name on the network (mDNS)
    try:
        for info in socket.getaddrinfo(hostname, None):
            names.add(str(info[4][0]).lower())  # an IP address (an int only where Python lacks IPv6)
    except OSError:
        pass
    for family, probe in ((socket.AF_INET, "10.254.254.254"), (socket.AF_INET6, "fd00::1")):
        try:  # the interface a route out would take (nothing is sent)
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 1))
                names.add(sock.getsockname()[0].lower())
        except OSError:
            pass
    return {n.split("%", 1)[0] for n in names if n}


def allowed_hosts(bind_host: str, extra: list[str] | tuple[str, ...] = ()) -> frozenset[str]:
    """The Host names a server bound to `bind_host` answers to; containing ANY: every name."""
    allowed = set(LOOPBACK_NAMES)
    host = host_name(bind_host)
    if _is_wildcard(host):
        allowed |= machine_names()
    elif host:
        allowed.add(host)
    allowed |= {ANY if name.strip() == ANY else host_name(name) for name in extra if name.strip()}
    return frozenset(allowed)


class HostCheck:
    """ASGI middleware: a request whose Host header is not an allowed name gets a 403."""

    def __init__(self, app, allowed: frozenset[str]):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and ANY not in self.allowed:
            header = dict(scope["headers"]).get(b"host")
            name = host_name(header.decode("latin-1")) if header else ""
            if name not in self.allowed:
                said = f"the host {name!r}" if header else "a request without a Host header"
                await ApiError(
                    403,
                    f"this server does not answer to {said}: use one of its own addresses "
                    "(flashdesk serve --allowed-hosts adds names)",
                    code="host_not_allowed",
                ).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
