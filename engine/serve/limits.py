"""How much the server takes on, and for how long: the time a client has to send its headers and its
body, how many chat requests may wait at once, and how long one may hold the server.

Why: the engine runs one request at a time, and every open connection holds a file descriptor and
memory. A client that opens connections and sends nothing, sends its body a byte at a time, or
queues requests faster than the engine answers them must not be able to starve everyone else; each
limit turns that into a quick, clear answer (a closed connection, a 408, a 429, a reply cut short).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

MAX_BODY_BYTES = 16 << 20  # far over any context's worth of text; a bigger body gets a 413, not the memory


@dataclass(frozen=True)
class Limits:
    """The defaults are `flashdesk serve`'s (docs/serving.md); 0 turns a time limit off."""

    header_seconds: float = 10.0  # the request line and headers, from a request's first byte (or the connection)
    body_seconds: float = 60.0  # the whole body, from the end of the headers
    max_queue: int = 32  # chat requests taken at once (being tokenized, waiting or running); more get a 429
    request_seconds: float = 600.0  # a chat request, from its arrival to its last token
    max_body_bytes: int = MAX_BODY_BYTES


class Admission:
    """The bounded queue: a Place for each chat request from its arrival to its end (any thread)."""

    def __init__(self, places: int):
        self.places = places
        self.taken = 0
        self.mean_seconds = 0.0  # of the requests that ended, a running mean (for Retry-After)
        self._lock = threading.Lock()

    def enter(self) -> "Place | None":
        """A place, or None when every one is taken."""
        with self._lock:
            if self.taken >= self.places:
                return None
            self.taken += 1
        return Place(self)

    def _leave(self, seconds: float) -> None:
        with self._lock:
            self.taken -= 1
            self.mean_seconds = seconds if not self.mean_seconds else 0.8 * self.mean_seconds + 0.2 * seconds

    def retry_after(self) -> int:
        """Seconds until a place is likely to be free: about one request's time, 1 to 60."""
        return max(1, min(60, math.ceil(self.mean_seconds)))


class Place:
    """A request's place in the queue; `leave` frees it (once, whichever of its ends comes first)."""

    def __init__(self, admission: Admission):
        self.admission, self.arrived = admission, time.monotonic()
        self._left = threading.Event()

    def seconds(self) -> float:
        return time.monotonic() - self.arrived

    def leave(self) -> None:
        with self.admission._lock:
            if self._left.is_set():
                return
            self._left.set()
        self.admission._leave(self.seconds())
