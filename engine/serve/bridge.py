"""From the engine thread to a request's coroutine: the job's events into an asyncio queue.

Why a bridge: the engine runs on a thread of its own (or the worker's main thread) and must never
wait for the network; asyncio queues are not thread-safe, so each event is handed to the event
loop with `call_soon_threadsafe`. The same queue also carries the client's disconnect, so a
handler waits on one thing at a time.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request

GONE = object()  # the client went away


class EventBridge:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._watch: asyncio.Task | None = None

    def put(self, event) -> None:
        """Any thread: hand an event to the request's coroutine."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server stopped, nobody waits for it
            pass

    async def get(self):
        return await self._queue.get()

    def watch(self, request: Request) -> None:
        """Put GONE on the queue when the client disconnects (the request body has been read)."""

        async def wait_for_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self._queue.put_nowait(GONE)

        self._watch = asyncio.ensure_future(wait_for_disconnect())

    def unwatch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
