"""The app's Settings (issue 33, items 3 and 4): a window of what a user sets once (Ctrl+,), each value
applied at once and kept for the next start; and a complete Help menu (Ctrl+/, the versions in About,
the documentation).

The window is the real one with an engine session that starts no worker process: its requests wait
as they do before a worker is up, and a test that needs a loaded model hands the session the
`Loaded` event the worker would send.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot, qVersion
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMessageBox

from flashdesk import protocol as p
from flashdesk.app import theme
from flashdesk.app.backends.engine_session import EngineSession
from flashdesk.app.chat.settings_dialog import STOP, ConversationSettings
from flashdesk.app.history.store import Store
from flashdesk.app.main_window import MainWindow
from flashdesk.app.pages.app_settings import AppSettings
from flashdesk.app.panels.telemetry import TelemetrySampler
from test_telemetry import NVMLError, fake_nvml, until


class QuietSession(EngineSession):
    """The real session, but no worker process is ever started: requests wait in `_waiting`."""

    def ensure_started(self) -> None:
        pass


@pytest.fixture
def store(tmp_path):
    opened = Store(tmp_path / "flashdesk.db")
    yield opened
    opened.close()


@pytest.fixture
def open_window(qtbot, store):
    """open_window() -> a shown, active MainWindow on the test's store; each call a new one (the
    earlier ones closed first), as the app started again."""
    windows: list[MainWindow] = []

    def make() -> MainWindow:
        for old in windows:
            old.close()
        sampler = TelemetrySampler(fake_nvml(init_error=NVMLError("NVML Shared Library Not Found")), interval=0.2)
        window = MainWindow(store, QuietSession(), sampler)
        qtbot.addWidget(window)
        window.show()
        window.activateWindow()
        QTest.qWaitForWindowActive(window)
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.close()


@pytest.fixture
def app_look():
    """The application's font, style and palette as the tests have them, put back after the test."""
    app = QApplication.instance()
    font, style, palette = app.font(), app.style().name(), app.palette()
    yield app
    theme.set_choice("system")
    app.setStyle(style)
    app.setPalette(palette)
    app.setFont(font)


def settings_of(window: MainWindow) -> AppSettings:
    window.findChild(QAction, "appSettingsAction").trigger()
    page = window.app_settings
    assert page is not None and page.isVisible()
    return page


def loaded(window: MainWindow, name: str = "tiny-gemma", sampling_defaults: dict | None = None) -> p.Loaded:
    """The worker's answer to a load, as the session takes it."""
    info = p.Loaded(
        target=f"/models/{name}",
        draft=None,
        name=name,
        device="cpu",
        device_name="CPU",
        device_uuid=None,
        dtype="float32",
        kv_dtype="float32",
        context_limit=4096,
        block_size=None,
        memory_bytes=1,
        seconds=0.1,
        sampling_defaults=dict(sampling_defaults or {}),
    )
    window.session._event(info)
    return info


# -- the window and its shortcut -------------------------------------------------------------------------


def test_ctrl_comma_opens_the_settings_and_the_conversations_own_moved(qtbot, open_window) -> None:
    w = open_window()
    qtbot.keyClick(w, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    page = w.app_settings
    assert isinstance(page, AppSettings) and page.isVisible() and not page.isModal()
    qtbot.keyClick(w, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)  # again: the same window
    assert len(w.findChildren(AppSettings)) == 1
    action = w.findChild(QAction, "appSettingsAction")
    assert action.menuRole() == QAction.MenuRole.PreferencesRole and action.text().replace("&", "") == "Settings…"
    assert [h.text() for h in page.headings] == ["Appearance", "New conversations", "Models", "API server", "Telemetry"]

    w.activateWindow()
    QTest.qWaitForWindowActive(w)
    alt = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
    qtbot.keyClick(w, Qt.Key.Key_Comma, alt)
    assert isinstance(w.settings_dialog, ConversationSettings) and w.settings_dialog.isVisible()
    w.settings_dialog.reject()
    lines = dict(w.shortcut_lines())
    assert lines["File → Settings…"] == "Ctrl+," and lines["Chat → Conversation settings…"] == "Ctrl+Alt+,"
    assert "Ctrl+Alt+," in w.settings_button.toolTip()


def test_the_fields_take_the_wheel_only_once_focused(qtbot, open_window) -> None:
    page = settings_of(open_window())
    for name in ("fontSize", "temperature", "topP", "topK", "maxTokens", "telemetryInterval"):
        box = page.findChild(QObject, name)
        assert box.focusPolicy() == Qt.FocusPolicy.StrongFocus and not box.keyboardTracking()
    assert page.theme.focusPolicy() == page.context_policy.focusPolicy() == Qt.FocusPolicy.StrongFocus


# -- each setting: applied, kept, restored ---------------------------------------------------------------


def test_the_text_size_applies_at_once_and_at_the_next_start(qtbot, open_window, store, app_look) -> None:
    from flashdesk.app import font_size

    app = app_look
    system = font_size.system_size()
    from flashdesk.app.chat.message_widget import BODY_SCALE

    w = open_window()
    conv = w.controller.new_conversation()
    store.add_message(conv.id, "user", "Hello")
    w.controller.open(conv.id)
    page = settings_of(w)
    assert page.font_size.value() == round(system)
    bigger = round(system) + 5
    page.font_size.setValue(bigger)
    assert app.font().pointSizeF() == bigger and store.setting("font_size") == bigger
    assert w.composer.edit.font().pointSizeF() == bigger  # the open window follows at once
    [message] = w.chat.widgets.values()  # and the chat, built again at the new size
    assert message.body.font().pointSizeF() == pytest.approx(bigger * BODY_SCALE)
    message.edit_button.click()  # an open editor is not built away: what is typed in it stays
    message.editor.setPlainText("Hello, half edited")
    page.font_size.setValue(bigger + 1)
    assert w.chat.widgets[message.message.id] is message and message.editor.toPlainText() == "Hello, half edited"
    message.cancel_edit()
    page.font_size.setValue(bigger)

    font = app.font()
    font.setPointSizeF(system)
    app.setFont(font)  # as a new process starts, at the system's size
    w = open_window()
    assert app.font().pointSizeF() == bigger  # restored before the window was built
    page = settings_of(w)
    assert page.font_size.value() == bigger
    page.system_font.click()
    assert app.font().pointSizeF() == system and store.setting("font_size") is None
    assert page.font_size.value() == round(system)


def test_the_theme_is_the_same_setting_as_view_theme(qtbot, open_window, store, app_look) -> None:
    w = open_window()
    page = settings_of(w)
    assert page.theme.currentData() == "system"
    page.theme.setCurrentIndex(page.theme.findData("dark"))
    assert theme.is_dark() and store.setting("theme") == "dark"
    assert w.findChild(QAction, "theme_dark").isChecked() and not w.findChild(QAction, "theme_system").isChecked()
    w.findChild(QAction, "theme_light").trigger()
    assert page.theme.currentData() == "light" and not theme.is_dark()
    w = open_window()
    assert settings_of(w).theme.currentData() == "light" and w.findChild(QAction, "theme_light").isChecked()


def test_new_conversations_take_the_default_sampling(qtbot, open_window, store) -> None:
    w = open_window()
    older = w.controller.new_conversation()
    page = settings_of(w)
    page.temperature.setValue(0.3)
    page.top_p.setValue(0.8)
    page.top_k.setValue(20)
    page.max_tokens.setValue(512)
    page.context_policy.setCurrentIndex(page.context_policy.findData(STOP))
    chosen = {"temperature": 0.3, "top_p": 0.8, "top_k": 20, "max_tokens": 512, "context_policy": STOP}
    assert store.setting("default_sampling") == chosen
    w.new_conversation()
    assert w.controller.conversation.sampling == chosen
    assert w.controller.sampling()["temperature"] == 0.3 and w.controller.sampling()["context_policy"] == STOP
    assert store.conversation(older.id).sampling == {}  # a conversation there before keeps its own

    page.max_tokens.setValue(0)  # automatic: left to the loaded context, not frozen into a conversation
    assert page.max_tokens.text() == "Automatic" and "max_tokens" not in store.setting("default_sampling")

    w = open_window()
    page = settings_of(w)
    assert (page.temperature.value(), page.top_k.value(), page.max_tokens.value()) == (0.3, 20, 0)
    w.new_conversation()
    assert w.controller.conversation.sampling == {k: v for k, v in chosen.items() if k != "max_tokens"}


def test_the_models_defaults_fill_the_fields(qtbot, open_window, store) -> None:
    w = open_window()
    page = settings_of(w)
    assert not page.model_defaults.isEnabled() and "Load a model" in page.model_defaults_note.text()
    loaded(w, "plain", {})
    assert not page.model_defaults.isEnabled() and "generation_config.json" in page.model_defaults_note.text()
    loaded(w, "gemma-4", {"temperature": 0.7, "top_k": 40})
    assert page.model_defaults.isEnabled() and "gemma-4 recommends temperature 0.7" in page.model_defaults_note.text()
    page.max_tokens.setValue(300)
    page.temperature.setValue(1.2)
    page.context_policy.setCurrentIndex(page.context_policy.findData(STOP))
    assert store.setting("default_sampling") == {"max_tokens": 300, "temperature": 1.2, "context_policy": STOP}
    page.model_defaults.click()
    assert (page.temperature.value(), page.top_p.value(), page.top_k.value()) == (0.7, 0.95, 40)
    assert page.max_tokens.value() == 0  # automatic
    assert store.setting("default_sampling") == {"context_policy": STOP}  # nothing of the model's frozen in

    # a field set alone is the only one kept: the rest follow whichever model is loaded next
    page.top_k.setValue(30)
    assert store.setting("default_sampling") == {"context_policy": STOP, "top_k": 30}
    loaded(w, "gemma-4-other", {"temperature": 0.5, "top_p": 0.9})
    w.new_conversation()
    s = w.controller.sampling()
    assert (s["temperature"], s["top_p"], s["top_k"], s["context_policy"]) == (0.5, 0.9, 30, STOP)


def test_a_models_folder_that_cannot_take_downloads_is_refused(
    qtbot, open_window, store, tmp_path, monkeypatch
) -> None:
    w = open_window()
    page = settings_of(w)
    assert page.models_folder.text() == "" and page.models_folder.placeholderText()  # the default, shown
    missing = tmp_path / "no-such-folder"
    page.models_folder.setText(str(missing))
    page.models_folder.editingFinished.emit()
    assert "does not exist" in page.folder_note.text() and "Not changed" in page.folder_note.text()
    assert store.setting("models_folder") is None and w.session.models_folder is None
    assert page.models_folder.text() == ""  # back to what is kept
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    page.models_folder.setText(str(a_file))
    page.models_folder.editingFinished.emit()
    assert "not a folder" in page.folder_note.text() and store.setting("models_folder") is None
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write anywhere: the folder is taken as a user would find it
        from flashdesk.app.pages import app_settings

        monkeypatch.setattr(app_settings.os, "access", lambda path, mode: Path(path) != locked)
    page.models_folder.setText(str(locked))
    page.models_folder.editingFinished.emit()
    assert "not writable" in page.folder_note.text() and store.setting("models_folder") is None
    monkeypatch.undo()

    w.downloading = "org/model"  # a download running: its files stay in one folder
    page.models_folder.setText(str(tmp_path))
    page.models_folder.editingFinished.emit()
    assert "org/model is downloading" in page.folder_note.text() and store.setting("models_folder") is None
    w.downloading = None

    page.models_folder.setText(str(tmp_path))
    page.models_folder.editingFinished.emit()
    assert store.setting("models_folder") == str(tmp_path) and "Not changed" not in page.folder_note.text()
    surveys = [m for m in w.session._waiting if isinstance(m, p.Survey)]
    assert w.pages.currentIndex() == 0 and surveys[-1].models_folder == str(tmp_path)  # the setup page looks again
    w.session.pull("org/model")
    assert w.session._waiting[-1] == p.Pull("org/model", str(tmp_path))

    w = open_window()
    assert w.session.models_folder == str(tmp_path)
    assert settings_of(w).models_folder.text() == str(tmp_path)


def test_the_engine_downloads_into_the_folder_it_is_given(monkeypatch, tmp_path) -> None:
    from flashdesk import paths
    from flashdesk.engine import worker

    monkeypatch.setattr(worker, "_HUB_CACHE_AT_START", None)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    worker.use_models_folder(str(tmp_path))
    assert paths.hub_cache_dir() == tmp_path
    worker.use_models_folder(None)  # back to the default
    assert "HF_HUB_CACHE" not in os.environ and paths.hub_cache_dir() != tmp_path
    line = p.encode(p.Load("org/model", models_folder=str(tmp_path)))
    assert p.decode(line).models_folder == str(tmp_path)


def test_the_telemetry_interval_applies_at_once(qtbot, open_window, store) -> None:
    w = open_window()
    page = settings_of(w)
    assert page.telemetry.minimum() == 250 and page.telemetry.maximum() == 5000
    page.telemetry.setValue(1500)
    assert w.sampler.interval == 1.5 and store.setting("telemetry_interval_ms") == 1500
    page.telemetry.setValue(100_000)  # out of range: the box refuses it
    assert page.telemetry.value() == 5000 and w.sampler.interval == 5.0
    w = open_window()
    assert w.sampler.interval == 5.0 and settings_of(w).telemetry.value() == 5000


def test_a_new_interval_ends_the_wait_under_the_old_one(qtbot) -> None:
    sampler = TelemetrySampler(fake_nvml(), interval=5.0)
    samples = []
    sampler.sampled.connect(samples.append)
    sampler.start()
    try:
        until(lambda: samples)
        sampler.set_interval(0.25)  # without it, the next sample would come 5 s after the first
        until(lambda: len(samples) >= 3, timeout_ms=3000)
    finally:
        sampler.stop()


def test_the_settings_lead_to_the_api_server(qtbot, open_window) -> None:
    w = open_window()
    w.set_side_panel(False)
    settings_of(w).server.click()
    assert w.pages.currentIndex() == 1 and not w.side.isHidden()


# -- Help ------------------------------------------------------------------------------------------------


def test_ctrl_slash_opens_the_keyboard_shortcuts(qtbot, open_window) -> None:
    w = open_window()
    qtbot.keyClick(w, Qt.Key.Key_Slash, Qt.KeyboardModifier.ControlModifier)
    box = w.findChild(QMessageBox, "shortcutsBox")
    assert box is not None and box.isVisible()
    assert dict(w.shortcut_lines())["Help → Keyboard shortcuts"] == "F1 or Ctrl+/"
    assert "F1 or Ctrl+/" in box.text() and "Ctrl+Alt+," in box.text()


def test_about_names_the_versions_and_the_model(qtbot, open_window) -> None:
    import PySide6

    import flashdesk

    w = open_window()
    w.findChild(QAction, "aboutAction").trigger()
    text = w.findChild(QMessageBox, "aboutBox").text()
    assert flashdesk.__version__ in text and platform.python_version() in text
    assert qVersion() in text and PySide6.__version__ in text and "none loaded" in text
    for engine_package in ("torch", "triton"):
        try:
            version = metadata.version(engine_package)
        except metadata.PackageNotFoundError:
            version = "not installed"
        assert f"{engine_package} (engine)</td><td>&nbsp;&nbsp;{version}" in text
    loaded(w, "tiny-gemma")
    w.findChild(QAction, "aboutAction").trigger()
    assert "tiny-gemma" in w.findChild(QMessageBox, "aboutBox").text()


class _Opened(QObject):
    def __init__(self):
        super().__init__()
        self.urls: list[QUrl] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url)


def test_help_opens_the_documentation(qtbot, open_window) -> None:
    w = open_window()
    opened = _Opened()
    QDesktopServices.setUrlHandler("file", opened, "open")
    try:
        w.findChild(QAction, "documentationAction").trigger()
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert len(opened.urls) == 1
    page = Path(opened.urls[0].toLocalFile())
    assert page.is_file() and page.parts[-2:] == ("docs", "app.md")
