"""The FlashDesk window: conversations on the left, the chat in the middle, speculation and
telemetry on the right; the model setup page before a model is chosen.

This module wires the parts together (store, engine session, chat controller, panels, menus and
shortcuts); each part does its own job in its own module. Base classes of the window: the model
setup flow (local models, downloads, the demo, a server as the engine: model_setup_flow.py), the
Settings window's effects (preferences.py), the context's warnings and offers (chat/context_flow.py)
and Help (window_help.py); where the side panel goes as the width changes is side_area.py.

The chat's engine is the local worker or a server (vLLM, SGLang, another FlashDesk) connected from
the setup page; the choice is remembered. A switch leaves nothing of the other engine on screen:
its status texts, its draft-length control, this computer's GPU shown as the engine's.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import asdict
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from flashdesk import protocol as p
from flashdesk import paths
from flashdesk.protocol import METHOD_NAMES
from flashdesk.app import theme, window_layout
from flashdesk.app.about import APP_NAME
from flashdesk.app.history import export
from flashdesk.app.chat.banner import Banner
from flashdesk.app.diagnostics import DiagnosticsCopier
from flashdesk.app.chat.chat_controller import ChatController
from flashdesk.app.backends.chat_engine import ChatEngine
from flashdesk.app.chat.chat_view import ChatView
from flashdesk.app.chat.composer import Composer
from flashdesk.app.chat.context_flow import CONTINUE_REPLY, NEW_LIKE, ContextFlow
from flashdesk.app.chat.context_gauge import ContextGauge, context_full_text
from flashdesk.app.chat.conversation_list import ConversationList
from flashdesk.app.backends.engine_session import DEAD, IDLE, LOADING, READY, STARTING, STOPPED, EngineSession
from flashdesk.app.model_setup_flow import ModelSetupFlow
from flashdesk.app.preferences import Preferences
from flashdesk.app.window_help import WindowHelp
from flashdesk.app.backends.remote_session import RemoteSession
from flashdesk.app.chat.reply import context_filled
from flashdesk.app.chat.settings_dialog import ConversationSettings
from flashdesk.app.pages.bench_page import BenchPage
from flashdesk.app.pages.setup_page import SetupPage
from flashdesk.app.side_area import SideArea
from flashdesk.app.side_strip import SideStrip
from flashdesk.app.panels.server_panel import ServerPanel
from flashdesk.app.panels.spec_panel import SpecPanel
from flashdesk.app.history.store import Store
from flashdesk.app.panels.telemetry import TelemetrySampler
from flashdesk.app.panels.telemetry_panel import TelemetryPanel

DEMO_NOTE = (
    "Demo model: a toy Gemma 4 (2.4 M parameters) and its drafter on the CPU. Its text only looks "
    "like code or English; the speed, speculation and memory readouts are real."
)
ERROR_TITLES = {p.OUT_OF_MEMORY: "Out of memory", p.BAD_INPUT: "Not possible", p.CRASH: "Engine error"}


def for_the_window(message: str) -> str:
    """An engine message in the window's words: what the command line would run, a window user
    does on the setup page (`flashdesk models pull ID` is its Download button)."""
    return re.sub(r"run `flashdesk models pull ([^`]+)`", r"press Download on the setup page (it fetches \1)", message)


class MainWindow(ModelSetupFlow, Preferences, ContextFlow, WindowHelp, QMainWindow):
    def __init__(
        self,
        store: Store,
        session: EngineSession | None = None,
        sampler: TelemetrySampler | None = None,
        remote: RemoteSession | None = None,
    ):
        super().__init__()
        self.setObjectName("flashdeskMainWindow")
        self.store = store
        self._shown: int | None = None  # the conversation whose messages the chat view shows
        self._downloads: list[str] = []  # Hub ids still to download, after the one in flight
        self.downloading: str | None = None  # the Hub id the engine is downloading
        self._load_after_download = False  # the recommended pair's one click: load once downloaded
        self.session = session or EngineSession(self)
        self.session.setParent(self)
        self.remote = remote or RemoteSession(self)
        self.remote.setParent(self)
        self.engine = ChatEngine(self.session, self.remote, self)  # what the chat talks to: one of the two
        self.sampler = sampler or TelemetrySampler(parent=self)
        self.controller = ChatController(store, self.engine, self.sampler.nvml.energy_mj, self)
        self.gauge = ContextGauge(
            self.session, self.controller.prompt_messages, self.controller.sampling, self._left_out, self
        )
        self.restore_preferences()  # Settings' values, the text size first: the widgets are built at it
        self._build()
        self._connect()
        self._menus()
        self.resize(1380, 860)
        window_layout.restore(store, self, self.splitter)  # as it was left, where it was kept

        self.spec.colour.setChecked(bool(store.setting("colour_by_origin", False)))
        self.side_area = SideArea(self, self.splitter, self.side, self.strip, self.side_action, store)
        self.side_area.drawer_changed.connect(lambda on: self.esc.setEnabled(on or self.controller.busy))
        self.side_area.fit()  # as kept, where it fits
        kept = store.setting("theme", "system")
        if kept in ("light", "dark"):  # the system's is what the app starts with (main.py)
            theme.set_choice(kept)
        for name, act in self.theme_actions.items():
            act.setChecked(name == (kept if kept in theme.CHOICES else "system"))
        spec = store.setting("speculation", {"enabled": True, "draft_length": None})
        self.session.speculation = (bool(spec.get("enabled", True)), spec.get("draft_length"), spec.get("method"))
        self.telemetry.set_gpu_available(self.sampler.gpu_available, self.sampler.problem)
        self.sampler.start()
        self.refresh_conversations()
        recent = store.conversations()
        self.controller.open(recent[0].id if recent else None)
        self.notice_box: QMessageBox | None = None
        if store.notice:  # shown on both pages: a banner over the chat, and a box that must be read
            self.notice_banner.show_text(store.notice, kind="error")
            self.notice_box = QMessageBox(
                QMessageBox.Icon.Warning,
                "FlashDesk: database moved aside",
                store.notice,
                QMessageBox.StandardButton.Ok,
                self,
            )
            self.notice_box.setModal(False)
            QTimer.singleShot(0, self.notice_box.show)
        model = store.setting("model")
        server = store.setting("remote")
        if model and model.get("target"):
            self.setup.set_selection(model)
        if server:
            self.setup.set_server_selection(server)
        if server and store.setting("engine") == "remote":
            self.connect_server(server)
        elif model and model.get("target"):
            self.show_chat()
            self.session.load(model)
        else:
            self.show_setup()

    # -- building -------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.setup = SetupPage()
        setup_scroll = QScrollArea()
        setup_scroll.setWidgetResizable(True)
        setup_scroll.setWidget(self.setup)

        self.conversations = ConversationList()
        self.title_label = QLabel()
        self.title_label.setObjectName("conversationTitle")
        self.model_label = QLabel()
        self.model_label.setObjectName("modelLabel")
        self.settings_button = QPushButton("Settings…")
        self.settings_button.setToolTip(
            "System prompt and sampling of this conversation (Ctrl+Alt+,); the app's Settings are Ctrl+,"
        )
        header = QHBoxLayout()
        header.setContentsMargins(16, 8, 16, 0)
        header.addWidget(self.title_label, 1)
        header.addWidget(self.model_label)
        header.addWidget(self.settings_button)
        self.demo_banner = Banner("demoBanner", closable=True)
        self.crash_banner = Banner("crashBanner", closable=False)
        self.notice_banner = Banner("noticeBanner")
        self.context_banner = Banner("contextBanner")  # past the context: the warning, a refusal, a full reply
        self.chat = ChatView()
        self.composer = Composer()
        column = QVBoxLayout()
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        column.addLayout(header)
        for banner in (self.notice_banner, self.crash_banner, self.demo_banner, self.context_banner):
            wrap = QHBoxLayout()
            wrap.setContentsMargins(16, 0, 16, 0)
            wrap.addWidget(banner)
            column.addLayout(wrap)
        column.addWidget(self.chat, 1)
        column.addWidget(self.composer)
        self.strip = SideStrip()  # the side panel, folded: shows while the panel is hidden
        self.strip.section_requested.connect(self.show_side_section)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addLayout(column, 1)
        row.addWidget(self.strip)
        middle = QWidget()
        middle.setLayout(row)

        self.spec = SpecPanel()
        self.telemetry = TelemetryPanel()
        self.server_panel = ServerPanel(self.session)  # serves the local engine to other programs
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(4, 8, 10, 8)
        side_layout.addWidget(self.spec)
        side_layout.addWidget(self.telemetry)
        side_layout.addWidget(self.server_panel)
        side_layout.addStretch(1)
        self.side = QScrollArea()
        self.side.setObjectName("sidePanel")
        self.side.setWidgetResizable(True)
        self.side.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.side.setWidget(side)
        self.side.setMinimumWidth(340)

        self.splitter = QSplitter()
        self.splitter.addWidget(self.conversations)
        self.splitter.addWidget(middle)
        self.splitter.addWidget(self.side)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes(list(window_layout.DEFAULT_WIDTHS))
        self.splitter.setChildrenCollapsible(False)

        self.bench = BenchPage(self.session)
        bench_scroll = QScrollArea()
        bench_scroll.setWidgetResizable(True)
        bench_scroll.setWidget(self.bench)

        self.pages = QStackedWidget()
        self.pages.addWidget(setup_scroll)
        self.pages.addWidget(self.splitter)
        self.pages.addWidget(bench_scroll)
        self.setCentralWidget(self.pages)

        self.engine_label = QLabel()
        self.engine_label.setObjectName("engineState")
        self.load_bar = QProgressBar()
        self.load_bar.setMaximumWidth(180)
        self.load_bar.hide()
        self.statusBar().addWidget(self.engine_label, 1)
        self.diagnostics = DiagnosticsCopier(self)
        self.diagnostics.done.connect(self._diagnostics_done)
        self.statusBar().addPermanentWidget(self.load_bar)
        self.esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self._escape)
        self.esc.setEnabled(False)  # only while a reply streams or the side panel is a drawer: else Esc is the fields'

    def _connect(self) -> None:
        s, c = self.session, self.controller
        s.state_changed.connect(self._engine_state)
        s.ready.connect(lambda _msg: setattr(self.sampler, "worker_pid", s.pid))
        s.load_progress.connect(self._load_progress)
        s.loaded.connect(self._loaded)
        s.inspected.connect(lambda m: self.setup.show_plan(m.lines, m.problems))
        s.inspected.connect(lambda _m: self.setup.set_busy(None))
        s.demo_created.connect(self._demo_created)
        s.pull_progress.connect(self._pull_progress)
        s.pull_checked.connect(self._pull_checked)
        s.pulled.connect(self._pulled)
        s.pull_cancelled.connect(self._pull_cancelled)
        s.error.connect(self._engine_error)
        s.died.connect(self._died)
        self.crash_banner.action.connect(self.restart_engine)

        c.conversation_changed.connect(self._conversation_changed)
        c.conversations_changed.connect(self.refresh_conversations)
        c.message_added.connect(self.chat.add)
        c.messages_removed.connect(self.chat.remove_from)
        c.messages_replaced.connect(self._show_messages_again)
        c.reply_started.connect(self.chat.add)
        c.reply_progress.connect(self._reply_progress)
        c.reply_ended.connect(self._reply_ended)
        c.busy_changed.connect(self._busy)
        c.turn_refused.connect(self._turn_refused)
        c.edit_refused.connect(self._edit_refused)
        self.composer.edit.textChanged.connect(self._composer_edited)
        self.session.server_traffic.connect(
            lambda t: self.telemetry.show_api_request(t.tokens_per_second, t.tau, self.server_panel.requests)
        )
        c.notice.connect(lambda text: self.notice_banner.show_text(text, kind="error"))  # a reply not saved

        self.conversations.selected.connect(c.open)
        self.conversations.hit_chosen.connect(self._open_hit)
        self.conversations.new_requested.connect(self.new_conversation)
        self.conversations.renamed.connect(c.rename)
        self.conversations.deleted.connect(c.delete)
        self.conversations.search.textChanged.connect(lambda _t: self.refresh_conversations())
        self.chat.edit_submitted.connect(c.resend)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.version_requested.connect(c.show_version)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(c.stop)
        self.composer.blocked.connect(self._send_blocked)
        self.composer.edit.textChanged.connect(lambda: self.gauge.typed(self.composer.edit.toPlainText()))
        self.gauge.changed.connect(self._show_gauge)
        self.gauge.send_checked.connect(self._send_checked)
        self.settings_button.clicked.connect(self.edit_settings)

        self.spec.speculation_changed.connect(self._speculation_changed)
        self.spec.colour_changed.connect(self._colour_changed)
        self.sampler.sampled.connect(self.telemetry.on_sample)

        self.setup.check_requested.connect(self.check_model)
        self.setup.load_requested.connect(self.load_model)
        self.setup.demo_requested.connect(self.start_demo)
        self.setup.download_requested.connect(self.download_models)
        self.setup.download_cancel_requested.connect(self.cancel_download)
        self.setup.recommended_requested.connect(self.start_recommended)
        s.surveyed.connect(lambda msg: self.setup.show_survey(asdict(msg)))
        self.setup.cancel_requested.connect(self.show_chat)
        self.setup.server_check_requested.connect(self.check_server)
        self.setup.server_connect_requested.connect(self.connect_server)
        self.setup.local_requested.connect(self.use_local_engine)
        r = self.remote
        r.state_changed.connect(self._remote_state)
        r.connected.connect(self._remote_connected)
        r.checked.connect(self.setup.show_server_check)
        r.checked.connect(self.server_checked)
        r.error.connect(self._remote_error)
        r.server_metrics.connect(self._server_reading)
        self.bench.back_requested.connect(self.show_chat)
        self.bench.use_draft_length.connect(self.use_draft_length)

    def _menus(self) -> None:
        def action(menu, text, slot, shortcut=None, name=None):
            act = QAction(text, self)
            if shortcut:
                act.setShortcut(QKeySequence(shortcut))
            act.triggered.connect(slot)
            if name:
                act.setObjectName(name)
            menu.addAction(act)
            return act

        bar = self.menuBar()
        file = bar.addMenu("&File")
        action(file, "&New conversation", self.new_conversation, QKeySequence.StandardKey.New)
        action(file, "Export as &Markdown…", lambda: self.export_dialog("md"), "Ctrl+E")
        action(file, "Export as &JSON…", lambda: self.export_dialog("json"), "Ctrl+Shift+E")
        file.addSeparator()
        action(file, "&Model setup…", self.show_setup, "Ctrl+M")
        settings = action(file, "&Settings…", self.show_app_settings, "Ctrl+,", "appSettingsAction")
        settings.setMenuRole(QAction.MenuRole.PreferencesRole)  # macOS: the application menu's Settings
        file.addSeparator()
        action(file, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        chat = bar.addMenu("&Chat")
        action(chat, "Focus the &message box", lambda: self.composer.edit.setFocus(), "Ctrl+L")
        action(
            chat, "&Search conversations", lambda: self.conversations.search.setFocus(), QKeySequence.StandardKey.Find
        )
        action(chat, "&Rename conversation", self.conversations.rename_current, "F2")
        action(chat, "Re&generate last reply", self.regenerate_last, "Ctrl+R")
        action(chat, "&Stop\tEsc", self.controller.stop)  # Esc is the window's own shortcut: shown, not bound
        # Ctrl+Alt, not Ctrl+Shift: Shift turns the comma into "<" on many keyboards, and Qt would
        # then match Ctrl+, (the app's Settings) for it
        action(chat, "Conversation se&ttings…", self.edit_settings, "Ctrl+Alt+,", "conversationSettingsAction")
        view = bar.addMenu("&View")
        self.colour_action = action(view, "&Colour reply by origin", self.spec.colour.toggle, "Ctrl+Shift+O")
        self.colour_action.setCheckable(True)
        self.side_action = action(view, "Show the &side panel", self.set_side_panel, "Ctrl+Shift+S", "sidePanelAction")
        self.side_action.setCheckable(True)
        self.side_action.setToolTip("Speculation and telemetry on the right; hide it for a wider chat")
        themes = view.addMenu("&Theme")
        self.theme_actions = {}
        for choice, label in (("system", "Follow the &system"), ("light", "&Light"), ("dark", "&Dark")):
            act = action(themes, label, lambda _on, c=choice: self.set_theme(c), name=f"theme_{choice}")
            act.setCheckable(True)
            self.theme_actions[choice] = act
        engine = bar.addMenu("&Engine")
        action(engine, "&Benchmark…", self.show_bench, "Ctrl+B", name="benchAction")
        action(engine, "&Restart engine", self.restart_engine, "Ctrl+Shift+R")
        action(engine, "&Unload model (free its memory)", self.session.unload)
        engine.addSeparator()
        action(engine, "&API server for other programs…", self.show_server_panel, name="serverPanelAction")
        help_menu = bar.addMenu("&Help")
        keys = action(help_menu, "&Keyboard shortcuts", self.show_shortcuts, name="shortcutsAction")
        keys.setShortcuts([QKeySequence("F1"), QKeySequence("Ctrl+/")])
        action(help_menu, "&Documentation", self.open_documentation, name="documentationAction")
        action(help_menu, "Copy &diagnostics", self.copy_diagnostics, name="copyDiagnosticsAction")
        action(help_menu, "&About FlashDesk", self.show_about, name="aboutAction")

    def show_server_panel(self) -> None:
        """Engine → API server: the chat page's side panel shown and scrolled to the server's part."""
        self.show_side_section("server")
        if self.server_panel.toggle.isEnabled():  # without a model loaded, it says why it is off
            self.server_panel.toggle.setFocus()

    def _escape(self) -> None:
        """Esc: the side panel's drawer closes first, then a streaming reply stops."""
        if self.side_area.drawer:
            self.set_side_panel(False)
        else:
            self.controller.stop()

    def show_side_section(self, section: str) -> None:
        """The side panel shown (also in a narrow window: asked for) and scrolled to `section`
        ("spec", "telemetry", "server"; "" its top): the strip's icons and the Engine menu. The
        strip's first icon closes the drawer again."""
        if section == "" and self.side_area.drawer:
            self.set_side_panel(False)
            return
        self.show_chat()
        if self.side.isHidden():
            self.set_side_panel(True)
        part = {"spec": self.spec, "telemetry": self.telemetry, "server": self.server_panel}.get(section)
        if part is None:
            self.side.verticalScrollBar().setValue(0)
        else:
            self.side.ensureWidgetVisible(part)

    def set_theme(self, choice: str) -> None:
        """View → Theme: the system's, light or dark; remembered for the next start."""
        theme.set_choice(choice)
        for name, act in self.theme_actions.items():
            act.setChecked(name == choice)
        self.store.set_setting("theme", choice)
        if self.app_settings is not None:  # Settings shows the same choice
            self.app_settings.show_theme(choice)

    # -- pages and titles ------------------------------------------------------------------------------

    def show_setup(self) -> None:
        self.setup.set_can_go_back(self.engine.state in (READY, LOADING))
        self.session.survey(str(paths.demo_dir()))  # the recommended pair's fit, the models on disk
        self.pages.setCurrentIndex(0)
        self.setWindowTitle(APP_NAME)
        self.setup.target.setFocus()

    def show_bench(self) -> None:
        self.pages.setCurrentIndex(2)
        self.setWindowTitle(f"Benchmark - {APP_NAME}")
        self.session.bench_history()

    def show_chat(self) -> None:
        self.pages.setCurrentIndex(1)
        self._update_title()
        self.composer.edit.setFocus()

    def _update_title(self) -> None:
        conv = self.controller.conversation
        title = conv.title if conv else "New conversation"
        self.title_label.setText(f"<b>{title}</b>")
        if self.pages.currentIndex() == 1:  # ending in the app's name: Qt then adds it no second time
            self.setWindowTitle(f"{title} — {APP_NAME}")

    def refresh_conversations(self) -> None:
        conv = self.controller.conversation
        reply = self.controller.reply
        streaming = self.store.message(reply.message_id) if reply is not None else None
        writing = streaming.conversation_id if streaming is not None else None
        hits = self.store.search(self.conversations.search.text())
        self.conversations.fill(hits, conv.id if conv else None, writing)

    def _conversation_changed(self, conv) -> None:
        same = conv is not None and conv.id == self._shown
        self._shown = conv.id if conv else None
        self.refresh_conversations()
        self._update_title()
        self.gauge.refresh()
        if same:  # renamed or new settings: the messages on screen are current
            return
        self.context_banner.hide()
        if self.session.state != DEAD:  # an error of the reply before belongs to its conversation
            self.crash_banner.hide()
        messages = self.store.messages(conv.id) if conv else []
        self.chat.set_messages(messages)
        reply = self.controller.reply
        if reply is not None and self.chat.widget(reply.message_id):
            self.chat.widget(reply.message_id).streaming = True
        self.chat.set_busy(self.controller.busy)
        last = next((m for m in reversed(messages) if m.role == "assistant" and m.stats), None)
        if not self.controller.busy:
            self.spec.show_stats(
                last.stats if last else None, "Last reply of this conversation." if last else "No reply yet."
            )
            self.telemetry.show_reply(last.stats if last else None)

    def _open_hit(self, message_id: int) -> None:
        """Show a search hit in the open conversation; one in a branch not shown switches the
        conversation to that branch first (while it writes a reply, the status bar says why not)."""
        words = self.conversations.search.text().split()
        if self.chat.show_hit(message_id, words):
            return
        if self.controller.show_branch_of(message_id):
            self.chat.show_hit(message_id, words)
        elif self.controller.busy:
            self.statusBar().showMessage(
                "The hit is in another branch of this conversation: it can be shown once the reply ends", 10_000
            )

    def _show_messages_again(self) -> None:
        """Another version of a message shows (or came back), with its branch: the chat, the gauge, the panels."""
        self._shown = None
        self._conversation_changed(self.controller.conversation)

    def _load_progress(self, msg: p.LoadProgress) -> None:
        if self.engine.is_remote:
            return
        self.engine_label.setText(f"Loading: {msg.text}")
        self.setup.set_busy(msg.text, msg.fraction)
        self.load_bar.setVisible(msg.fraction < 1)
        if msg.fraction < 0:
            self.load_bar.setRange(0, 0)
        else:
            self.load_bar.setRange(0, 100)
            self.load_bar.setValue(int(msg.fraction * 100))

    def _loaded(self, info: p.Loaded) -> None:
        if self.engine.is_remote:  # a load asked before the server was chosen: free its memory again
            self.session.unload()
            return
        self.setup.set_busy(None)
        self.load_bar.hide()
        demo = bool((self.session.load_settings or {}).get("demo"))
        name = "Demo model" if demo else info.name
        where = info.device_name if info.device.startswith("cuda") else "CPU"
        methods = info.methods or ([info.method] if info.method else [])
        drafts = "".join(f" + {METHOD_NAMES.get(m, m)}" for m in methods)
        self.model_label.setText(f"{name}{drafts} · {where}")
        self.setup.status.setText(f"Loaded: {name}{drafts} on {where}, in {info.seconds:.1f} s.")  # not "loaded"
        self.model_label.setToolTip(
            f"{info.target}\n{info.draft or 'no draft model'}\n{info.dtype}, KV {info.kv_dtype}, "
            f"context {info.context_limit} tokens, loaded in {info.seconds:.1f} s"
        )
        self.engine_label.setText(f"{name} ready on {where} · context {info.context_limit} tokens")
        if demo:
            self.demo_banner.show_text(DEMO_NOTE)
        else:
            self.demo_banner.hide()
        enabled, length, method = self.session.speculation
        self.spec.set_methods(methods, method)
        self.spec.set_block_size(info.block_size, enabled, length or info.default_draft_length)
        self.spec.length_note.setToolTip(info.default_note or self.spec.length_note.toolTip())
        self.bench.set_model(info)
        self.sampler.nvml.bind(info.device_uuid)
        self.crash_banner.hide()
        if info.kernel_note:  # some kernels failed their self-test on this card: say so, once a load
            self.notice_banner.show_text(info.kernel_note[:1].upper() + info.kernel_note[1:])
        self.composer.set_can_send(True)

    def _engine_state(self, state: str) -> None:
        if self.engine.is_remote:
            return  # the local worker's states are not the chat's engine's
        idle = (
            "No model loaded: Engine → Restart engine loads it again, File → Model setup picks another."
            if self.session.load_settings
            else "No model loaded yet: pick one on the setup page, or try the demo."
        )
        texts = {
            STARTING: "Starting the engine…",
            LOADING: "Loading the model…",
            DEAD: "The engine stopped.",
            IDLE: idle,
            STOPPED: idle,
        }
        if state in texts:
            self.engine_label.setText(texts[state])
        if state != READY:
            reason = {
                STARTING: "Starting the engine…",
                LOADING: "Loading the model…",
                DEAD: "The engine stopped: Restart engine (the button above, or Ctrl+Shift+R) starts it again.",
            }.get(state, "No model loaded (File → Model setup)")
            self.composer.set_can_send(False, reason)

    def _engine_error(self, err: p.Error) -> None:
        title = ERROR_TITLES.get(err.kind, "Error")
        if err.during == "pull" or (err.during == "startup" and self.downloading):
            self.downloading = None
            self._downloads.clear()
            self._load_after_download = False
            self.setup.show_error(f"Download failed: {err.message}")
            return
        if err.during == "inspect" and "models pull" in err.message and self.setup.hub_ids():
            self.setup.show_error(f"{title}: {for_the_window(err.message)}.")
            return
        if self.engine.is_remote and err.during in ("load", "generate", "request"):
            return  # the local engine is not the chat's now
        if err.during in ("load", "inspect", "demo", "startup"):
            self.load_bar.hide()
            message = for_the_window(err.message)
            self.engine_label.setText(f"{title}: {message}")
            self.setup.show_error(f"{title}: {message}")
            if err.during == "load":
                self.show_setup()
            return
        if err.during == "bench":
            return  # the Benchmark page says it
        if err.during == "survey":
            self.setup.fit.setText(f"Could not check this computer: {err.message}")
            return
        if err.during == "generate" and err.kind == p.BAD_INPUT:
            return  # the chat says it: a refused turn in the context banner, else the reply's status
        text = f"<b>{title}.</b> {err.message}"
        if err.kind == p.OUT_OF_MEMORY:
            text += " Shorten the conversation, lower max tokens or the context, then try again."
        self.crash_banner.show_text(text, "Restart engine" if err.kind == p.CRASH else None, "error")
        self.crash_banner.close_button.setVisible(err.kind != p.CRASH)

    def _died(self, reason: str) -> None:
        self.load_bar.hide()
        if self.downloading:
            self.downloading = None
            self._downloads.clear()
            self._load_after_download = False
            self.setup.show_error(
                f"The engine stopped during the download: {reason} Download again to continue where it stopped."
            )
        if self.engine.is_remote:
            return
        self.crash_banner.show_text(
            f"<b>The engine stopped.</b> {reason} Your conversation is kept, up to the last token received.",
            "Restart engine",
            "error",
        )
        self.crash_banner.close_button.setVisible(False)

    def _send_blocked(self, why: str) -> None:
        """Enter with a message while the engine cannot take it: say so; offer the restart when the
        engine stopped or has no model (the message stays in the box)."""
        if self.engine.is_remote:
            if self.remote.state == STOPPED:
                self.crash_banner.show_text(
                    f"<b>{why}</b> Your message is kept in the box: connect again, then press Enter again.",
                    "Connect again",
                    "error",
                )
                self.crash_banner.close_button.setVisible(True)
            else:
                self.engine_label.setText(f"{why} Your message is kept: press Enter again once connected.")
            return
        state = self.session.state
        if state in (DEAD, IDLE) and (self.session.load_settings or state == DEAD):
            self.crash_banner.show_text(
                f"<b>{why or 'The engine is not running.'}</b> Your message is kept in "
                "the box: restart the engine, then press Enter again.",
                "Restart engine",
                "error",
            )
            self.crash_banner.close_button.setVisible(True)
        elif state in (STARTING, LOADING):
            self.engine_label.setText(f"{why} Your message is kept: press Enter again once the model is ready.")
        else:
            self.engine_label.setText(f"{why or 'No model loaded.'} Your message is kept in the box.")

    def restart_engine(self) -> None:
        """Engine → Restart: a new worker, or a new connection to the server."""
        self.crash_banner.hide()
        if self.engine.is_remote:
            self.remote.reconnect()
        else:
            self.session.restart()

    # -- chat ----------------------------------------------------------------------------------------------

    def new_conversation(self) -> None:
        self.controller.new_conversation()
        self.show_chat()

    def regenerate_last(self) -> None:
        if self.controller.conversation is None:
            return
        messages = self.store.messages(self.controller.conversation.id)
        last = next((m for m in reversed(messages) if m.role == "assistant"), None)
        if last is not None:
            self.regenerate(last.id)

    def regenerate(self, message_id: int) -> None:
        """A new version of a reply; at temperature 0 it is the same one again, and the status bar
        says so and where to change it."""
        if self.controller.regenerate(message_id) and not self.controller.sampling().get("temperature"):
            self.statusBar().showMessage(
                "Temperature 0 writes the same reply again: raise it in the conversation's settings "
                "(Chat → Conversation settings) for a different one",
                10_000,
            )

    def _busy(self, busy: bool) -> None:
        self.composer.set_busy(busy)
        self.chat.set_busy(busy)
        self.esc.setEnabled(busy or self.side_area.drawer)
        self.refresh_conversations()  # the mark of the conversation writing a reply
        if not busy:
            self.telemetry.set_live(None)

    def _reply_progress(self, reply) -> None:
        widget = self.chat.widget(reply.message_id)
        if widget is not None:
            thinking = bool(reply.thought) and not reply.answer
            widget.show_stream(reply.text, reply.thought_text, reply.thought_seconds, reply.origins, thinking)
        stats = reply.stats()
        if widget is not None:
            widget.set_context(stats)
        self.telemetry.set_live(reply.live_tokens_per_second())
        if reply.prompt_tokens and widget is not None:  # the gauge under the conversation it streams into
            self.gauge.streaming(reply.prompt_tokens + reply.tokens)
        self.telemetry.show_reply(stats)
        self.spec.show_stats(
            reply.spec,
            "This reply, live."
            if not self.engine.is_remote
            else "This reply, live (the server's figures since it began).",
        )

    def _reply_ended(self, message) -> None:
        widget = self.chat.widget(message.id)
        if widget is not None:
            widget.show_message(message)
        self.spec.show_stats(message.stats, "Last reply of this conversation.")
        self.telemetry.show_reply(message.stats)
        self.gauge.refresh()
        conv = self.controller.conversation
        if context_filled(message.stats) and conv is not None and message.conversation_id == conv.id:
            limit = self.engine.info.context_limit if self.engine.info else None
            self._send_warning = False  # not about the box's text: emptying it leaves this one
            self.context_banner.show_choice(
                context_full_text(limit, self.engine.is_remote),
                (CONTINUE_REPLY, self._continue),
                (NEW_LIKE, self._new_like),
            )

    def edit_settings(self) -> None:
        if self.controller.conversation is None:
            self.controller.new_conversation()
        conv = self.controller.conversation
        info = self.engine.info
        dialog = ConversationSettings(
            conv.title,
            conv.system_prompt,
            self.controller.sampling(),
            self,
            info.context_limit or None if info else None,
        )
        dialog.accepted.connect(lambda: self.controller.update_settings(*dialog.result_values()))
        dialog.open()
        self.settings_dialog = dialog

    def set_side_panel(self, shown: bool) -> None:
        """View → Show the side panel: docked where it fits (remembered), a drawer over the chat in
        a narrow window (app/side_area.py)."""
        self.side_area.set_shown(shown)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if hasattr(self, "side_area"):
            self.side_area.fit()

    def use_draft_length(self, length: int | str, method: str | None = None) -> None:
        """The Benchmark page's "Use the best": speculation on at that draft length (or auto), with that
        method where it names one; kept for the local engine while a server (which decides its own)
        is the chat's."""
        if self.engine.is_remote:
            self._speculation_changed(True, length, method)
            return
        if method is not None:
            self.spec.choose_method(method)
        self.spec.set_block_size(self.spec.block_size, True, length)
        self._speculation_changed(*self.spec.values())

    def _speculation_changed(self, enabled: bool, length: int | str, method: str | None = None) -> None:
        self.session.set_speculation(enabled, length, method)
        self.store.set_setting("speculation", {"enabled": enabled, "draft_length": length, "method": method})

    def _colour_changed(self, on: bool) -> None:
        self.chat.set_colour_by_origin(on)
        self.colour_action.setChecked(on)
        self.store.set_setting("colour_by_origin", on)

    # -- export -------------------------------------------------------------------------------------------

    def export_dialog(self, kind: str) -> None:
        conv = self.controller.conversation
        if conv is None:
            return
        path, _ = QFileDialog.getSaveFileName(
            self,
            "Export conversation",
            str(Path.home() / export.file_name(conv.title, kind)),
            "Markdown (*.md *.markdown)" if kind == "md" else "JSON (*.json)",
        )
        if not path:
            return
        chosen = export.with_extension(Path(path), kind)
        if chosen != Path(path) and chosen.exists():  # the dialog asked about the name typed, not this one
            answer = QMessageBox.question(self, "Export conversation", f"{chosen.name} already exists. Replace it?")
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.export_to(chosen, kind)

    def export_to(self, path: Path, kind: str) -> None:
        conv = self.controller.conversation
        messages = self.store.messages(conv.id)
        versions = {m.id: self.store.versions(m.id) for m in messages if m.versions > 1}
        text = (export.to_markdown if kind == "md" else export.to_json)(conv, messages, versions)
        Path(path).write_text(text, encoding="utf-8")
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    # -- theme and closing -----------------------------------------------------------------------------------

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange and hasattr(self, "chat"):
            self.chat.refresh_style()
            self.spec.apply_theme()
            self.telemetry.apply_theme()
            self.server_panel.apply_theme()
            self.composer.apply_theme()
            self.bench.apply_theme()
            self.strip.apply_theme()
            for banner in (self.demo_banner, self.crash_banner, self.notice_banner, self.context_banner):
                banner.apply_theme()

    def shutdown(self) -> None:
        """Keep the reply as it stands and the window's layout, stop sampling, end the engine
        process. Idempotent."""
        try:
            window_layout.save(self.store, self, self.splitter)
        except sqlite3.Error:  # a database that cannot be written loses the layout, not the shutdown
            pass
        self.controller.close()
        self.sampler.stop()
        self.remote.shutdown()
        self.session.shutdown()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
