"""The engine the chat talks to: the local worker (EngineSession) or a server (RemoteSession).

Why a switch: the chat controller is made once and speaks to one engine object through `state`,
`info`, `generate`, `cancel` and the signals `started`, `steps`, `finished`, `error` and `died`.
This object offers exactly those and hands them to and from whichever engine is in use, so the
controller works unchanged with either, and an event of the engine not in use (a late answer)
never reaches the chat.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from flashdesk import protocol as p


class ChatEngine(QObject):
    started = Signal(object)
    steps = Signal(list)
    finished = Signal(object)
    error = Signal(object)
    died = Signal(str)

    def __init__(self, local, remote, parent: QObject | None = None):
        super().__init__(parent)
        self.local = local
        self.remote = remote
        self.active = local
        for engine in (local, remote):
            for name in ("started", "steps", "finished", "error"):
                getattr(engine, name).connect(self._forward(engine, name))
        local.died.connect(self._forward(local, "died"))

    def _forward(self, engine, name: str):
        signal = getattr(self, name)

        def forward(value) -> None:
            if engine is self.active:
                signal.emit(value)

        return forward

    @property
    def is_remote(self) -> bool:
        return self.active is self.remote

    def use(self, engine) -> None:
        """Chat with `engine` (the local or the remote one) from now on."""
        self.active = engine

    @property
    def state(self) -> str:
        return self.active.state

    @property
    def info(self) -> p.Loaded | None:
        return self.active.info

    def generate(self, msg: p.Generate) -> bool:
        return self.active.generate(msg)

    def cancel(self, request_id: str) -> None:
        self.active.cancel(request_id)
