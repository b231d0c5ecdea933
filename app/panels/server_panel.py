"""The local API server panel: serve the loaded model to other programs (`flashdesk serve`'s API, run by
the worker on the engine it has loaded), with the URL to copy and the requests it answered.

Why in the app: editors, agents and scripts speak the OpenAI API, and the model is already loaded
here; starting a second process would load it twice. HTTP requests take turns with the app's own
replies on the engine. This computer only by default; "other devices" listens on every address and
then always needs an API key (a random one is made), as the engine insists.
"""

from __future__ import annotations

import secrets
import socket

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from flashdesk import protocol as p
from flashdesk.protocol import METHOD_NAMES
from flashdesk.app import theme
from flashdesk.app.backends.engine_session import READY, EngineSession
from flashdesk.app.wheel_guard import wheel_only_when_focused

LOOPBACK, EVERY_ADDRESS = "127.0.0.1", "0.0.0.0"
# an API key's letters: none that read alike (0/O, 1/l/I), so it can be typed from a screen
KEY_LETTERS = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def new_api_key(length: int = 32) -> str:
    return "".join(secrets.choice(KEY_LETTERS) for _ in range(length))


def lan_address() -> str | None:
    """This computer's address on its network (the interface a route out would take; nothing is
    sent), for the URL other devices use; None without a network."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.254.254.254", 1))
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == EVERY_ADDRESS else address


def shown_url(url: str, host: str) -> str:
    """The base URL to give clients: served on every address, the one other devices can reach."""
    if host != EVERY_ADDRESS:
        return url
    return url.replace(EVERY_ADDRESS, lan_address() or socket.gethostname())


DEFAULT_PORT = 8719
TRAFFIC_SHOWN = 50  # the newest requests listed


def traffic_line(t: p.ServerTraffic) -> str:
    """One request in a line: status, finish, tokens in (cached) and out, speed, tau, time."""
    line = f"{t.status} {t.reason} · {t.prompt_tokens} in"
    if t.cached_tokens:
        line += f" ({t.cached_tokens} cached)"
    line += f" · {t.completion_tokens} out"
    if t.tokens_per_second:
        line += f" · {t.tokens_per_second:.0f} tok/s"
    if t.tau is not None:
        line += f" · τ {t.tau:.2f}" + (f" ({METHOD_NAMES.get(t.method, t.method)})" if t.method else "")
    return line + f" · {t.seconds:.1f} s" + (f" · {t.message}" if t.message else "")


class ServerPanel(QGroupBox):
    def __init__(self, session: EngineSession, parent: QWidget | None = None):
        super().__init__("API server", parent)
        self.setObjectName("serverPanel")
        self.session = session
        self.requests = 0
        self.tokens_out = 0

        self.toggle = QCheckBox("Serve the model to other programs")
        self.toggle.setObjectName("serverToggle")
        self.toggle.setToolTip(
            "An OpenAI-compatible API (chat completions, streamed; /metrics) on the loaded "
            "model. Its requests take turns with your own replies"
        )
        self.everywhere = QCheckBox("Let other devices connect (needs the API key)")
        self.everywhere.setObjectName("serverEverywhere")
        self.port = QSpinBox()
        self.port.setObjectName("serverPort")
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")
        self.port.setValue(DEFAULT_PORT)
        wheel_only_when_focused(self.port)
        self.key = QLineEdit()
        self.key.setObjectName("serverKey")
        self.key.setPlaceholderText("none: this computer only")
        self.key.setToolTip("Clients send it as 'Authorization: Bearer KEY' (the openai package's api_key)")
        self.url = QLineEdit()
        self.url.setObjectName("serverUrl")
        self.url.setReadOnly(True)
        self.url.setPlaceholderText("not serving")
        self.copy = QPushButton("Copy")
        self.copy.setObjectName("serverCopy")
        self.copy.setToolTip("Copy the API's base URL (what clients take as base_url)")
        self.status = QLabel()
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        self.summary = QLabel("No requests yet.")
        self.summary.setObjectName("serverSummary")
        self.traffic = QListWidget()
        self.traffic.setObjectName("serverTraffic")
        self.traffic.setMaximumHeight(120)
        self.traffic.setWordWrap(True)  # a request's whole line, on two if it must

        url_row = QHBoxLayout()
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.copy)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("Port", self.port)
        form.addRow("API key", self.key)
        form.addRow("Base URL", url_row)
        layout = QVBoxLayout(self)
        layout.addWidget(self.toggle)
        layout.addWidget(self.everywhere)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.summary)
        layout.addWidget(self.traffic)
        self.apply_theme()

        self.toggle.toggled.connect(self._toggled)
        self.everywhere.toggled.connect(self._everywhere)
        self.copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url.text()))
        session.server_state.connect(self.show_state)
        session.server_traffic.connect(self.add_traffic)
        session.state_changed.connect(self._engine_state)
        self.show_state(p.ServerState(False))
        self._engine_state(session.state)

    def apply_theme(self) -> None:
        self.setStyleSheet(f"QLabel#muted {{ color: {theme.colors()['muted']}; }}")

    # -- the user's side ------------------------------------------------------------------------------

    def _toggled(self, on: bool) -> None:
        if not on:
            self.session.client.send(p.StopServer())
            self.status.setText("Stopping…")
            return
        host = EVERY_ADDRESS if self.everywhere.isChecked() else LOOPBACK
        self.session.client.send(p.StartServer(host, self.port.value(), self.key.text().strip() or None))
        self.status.setText("Starting…")
        self._settings_enabled(False)

    def _everywhere(self, on: bool) -> None:
        if on and not self.key.text().strip():
            self.key.setText(new_api_key())

    def _settings_enabled(self, enabled: bool) -> None:
        for widget in (self.everywhere, self.port):
            widget.setEnabled(enabled)
        self.key.setReadOnly(not enabled)  # while serving: fixed, but it can be selected and copied

    # -- the engine's side ----------------------------------------------------------------------------

    def _engine_state(self, state: str) -> None:
        """Serving needs a loaded model; a load, an unload or the worker's end stops the server."""
        ready = state == READY
        self.toggle.setEnabled(ready)
        if not ready:
            self.show_state(p.ServerState(False))
            self.status.setText("Load a model to serve it.")
        elif not self.toggle.isChecked():
            self.status.setText("Not serving.")

    def show_state(self, state: p.ServerState) -> None:
        self.toggle.blockSignals(True)
        self.toggle.setChecked(state.running)
        self.toggle.blockSignals(False)
        self._settings_enabled(not state.running)
        self.url.setText(shown_url(state.url, state.host) + "/v1" if state.running else "")
        self.copy.setEnabled(state.running)
        if state.running:
            where = "other devices too" if state.host == EVERY_ADDRESS else "this computer only"
            self.status.setText(
                f"Serving {state.model} ({where}{', API key required' if state.api_key_required else ''})."
            )
        else:
            self.status.setText(f"Not serving: {state.error}" if state.error else "Not serving.")

    def add_traffic(self, t: p.ServerTraffic) -> None:
        self.requests += 1
        self.tokens_out += t.completion_tokens
        self.summary.setText(
            f"{self.requests} request{'s' if self.requests != 1 else ''}, {self.tokens_out} tokens generated"
        )
        line = traffic_line(t)
        self.traffic.insertItem(0, line)
        self.traffic.item(0).setToolTip(line)
        while self.traffic.count() > TRAFFIC_SHOWN:
            self.traffic.takeItem(self.traffic.count() - 1)
