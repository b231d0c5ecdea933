"""Settings (Ctrl+,): what a user sets once for the whole app, apart from each conversation's own
settings (Chat → Conversation settings): the theme and text size, the sampling new conversations
start with, the models folder, the API server, and how often the telemetry samples.

Why a window beside the chat with no OK button: each change applies at once (a theme or a text size
is judged by looking at the window), and one window is easier to find again than a dialog to reopen.
This page holds the fields and refuses what cannot be used (ranges, a folder that cannot take the
downloads); the window (preferences.py) applies and keeps each value.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from flashdesk.app import theme
from flashdesk.app.chat.settings_dialog import (
    DROP_OLDEST,
    MAX_TOKENS_NOTE,
    context_policy_box,
    add_section,
    temperature_box,
    top_k_box,
    top_p_box,
)
from flashdesk.app.font_size import SIZE_RANGE
from flashdesk.app.panels.telemetry import INTERVAL_RANGE_MS
from flashdesk.app.wheel_guard import wheel_only_when_focused

THEMES = {"system": "Follow the system", "light": "Light", "dark": "Dark"}
AUTOMATIC = "Automatic"  # the reply cap left to the context (max_tokens 0 here, absent when kept)
LONGEST_REPLY = 262144
INTERVAL_STEP_MS = 250


def folder_problem(text: str) -> str | None:
    """Why `text` cannot be the models folder (said to the user), or None when downloads can go there."""
    folder = Path(text).expanduser()
    if not folder.is_absolute():
        return f"“{text}” is not a full path: choose the folder with Browse…"
    if not folder.is_dir():
        return f"{folder} does not exist (or is not a folder): create it first, or choose another one."
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable: downloads could not be saved there. Choose a folder you can write to."
    return None


class AppSettings(QDialog):
    theme_chosen = Signal(str)  # one of THEMES
    font_size_chosen = Signal(object)  # points, or None: the system's
    sampling_chosen = Signal(dict)  # fields new conversations start with; None: follow the model (or automatic)
    model_defaults_requested = Signal()
    models_folder_chosen = Signal(object)  # a folder downloads can go to, or None: the default
    server_requested = Signal()
    telemetry_interval_chosen = Signal(int)  # milliseconds

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("appSettings")
        self.setWindowTitle("Settings")
        self.setModal(False)
        self._folder: str | None = None  # the models folder kept (None: the default)

        self.theme = QComboBox()
        self.theme.setObjectName("themeChoice")
        for key, text in THEMES.items():
            self.theme.addItem(text, key)
        self.font_size = QSpinBox()
        self.font_size.setObjectName("fontSize")
        self.font_size.setRange(*SIZE_RANGE)
        self.font_size.setSuffix(" pt")
        self.system_font = QPushButton("System size")
        self.system_font.setObjectName("systemFontSize")
        self.system_font.setToolTip("The text size of your desktop")

        self.temperature = temperature_box()
        self.top_p = top_p_box()
        self.top_k = top_k_box()
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("maxTokens")
        self.max_tokens.setRange(0, LONGEST_REPLY)
        self.max_tokens.setSpecialValueText(AUTOMATIC)
        self.max_tokens.setToolTip(
            f"{AUTOMATIC} (the lowest value): at most a quarter of the loaded model's context. {MAX_TOKENS_NOTE}"
        )
        self.context_policy = context_policy_box()
        self.model_defaults = QPushButton("Use the model's defaults")
        self.model_defaults.setObjectName("modelDefaults")
        self.model_defaults_note = QLabel()
        self.model_defaults_note.setObjectName("modelDefaultsNote")
        self.model_defaults_note.setWordWrap(True)

        self.models_folder = QLineEdit()
        self.models_folder.setObjectName("modelsFolder")
        self.browse = QPushButton("Browse…")
        self.browse.setObjectName("browseModelsFolder")
        self.default_folder = QPushButton("Default")
        self.default_folder.setObjectName("defaultModelsFolder")
        self.folder_note = QLabel()
        self.folder_note.setObjectName("modelsFolderNote")
        self.folder_note.setWordWrap(True)
        self.folder_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.server = QPushButton("Open the API server panel…")
        self.server.setObjectName("serverPanelButton")
        self.telemetry = QSpinBox()
        self.telemetry.setObjectName("telemetryInterval")
        self.telemetry.setRange(*INTERVAL_RANGE_MS)
        self.telemetry.setSingleStep(INTERVAL_STEP_MS)
        self.telemetry.setSuffix(" ms")

        spins = (self.font_size, self.temperature, self.top_p, self.top_k, self.max_tokens, self.telemetry)
        for box in spins:
            box.setKeyboardTracking(False)  # a value typed is taken once it is complete, not digit by digit
        wheel_only_when_focused(*spins, self.theme, self.context_policy)
        self._lay_out()
        self._connect()
        self.resize(600, 680)

    def _lay_out(self) -> None:
        content = QWidget()
        layout = QVBoxLayout(content)
        self.headings: list[QLabel] = []
        form = self._section(layout, "Appearance")
        form.addRow("Theme", self.theme)
        form.addRow("Text size", _row(self.font_size, self.system_font))
        form = self._section(layout, "New conversations")
        form.addRow(QLabel("What a new conversation starts with; each one's own settings change it later."))
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_tokens)
        form.addRow("When the conversation outgrows the context", self.context_policy)
        form.addRow("", self.model_defaults)
        form.addRow(self.model_defaults_note)
        form = self._section(layout, "Models")
        form.addRow("Models folder", _row(self.models_folder, self.browse, self.default_folder))
        form.addRow(self.folder_note)
        form = self._section(layout, "API server")
        form.addRow(QLabel("Serve the loaded model to other programs (an OpenAI-compatible API)."))
        form.addRow("", self.server)
        form = self._section(layout, "Telemetry")
        form.addRow("Sample GPU and memory every", self.telemetry)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(content)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        outer = QVBoxLayout(self)
        outer.addWidget(scroll, 1)
        outer.addWidget(buttons)

    def _section(self, layout: QVBoxLayout, title: str) -> QFormLayout:
        return add_section(layout, self.headings, title)

    def _connect(self) -> None:
        self.theme.currentIndexChanged.connect(lambda _i: self.theme_chosen.emit(self.theme.currentData()))
        self.font_size.valueChanged.connect(self.font_size_chosen.emit)
        self.system_font.clicked.connect(lambda: self.font_size_chosen.emit(None))
        # each field says only its own value: the ones left alone go on following the loaded model
        for key, box in (("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k)):
            box.valueChanged.connect(lambda _v, k=key: self.sampling_chosen.emit({k: self.sampling()[k]}))
        self.max_tokens.valueChanged.connect(
            lambda v: self.sampling_chosen.emit({"max_tokens": v or None})  # the lowest: automatic
        )
        self.context_policy.currentIndexChanged.connect(
            lambda _i: self.sampling_chosen.emit({"context_policy": self.context_policy.currentData()})
        )
        self.model_defaults.clicked.connect(self.model_defaults_requested)
        self.models_folder.editingFinished.connect(lambda: self._choose_folder(self.models_folder.text()))
        self.browse.clicked.connect(self._browse)
        self.default_folder.clicked.connect(lambda: self._choose_folder(""))
        self.server.clicked.connect(self.server_requested)
        self.telemetry.valueChanged.connect(self.telemetry_interval_chosen.emit)

    # -- values in ------------------------------------------------------------------------------------

    def show_theme(self, choice: str) -> None:
        with _quiet(self.theme):
            self.theme.setCurrentIndex(max(0, self.theme.findData(choice)))

    def show_font_size(self, points: float) -> None:
        with _quiet(self.font_size):
            self.font_size.setValue(round(points))

    def show_sampling(self, sampling: dict) -> None:
        """The fields as `sampling` says (a full set: the kept defaults over the model's and ours)."""
        boxes = (self.temperature, self.top_p, self.top_k, self.max_tokens, self.context_policy)
        with _quiet(*boxes):
            self.temperature.setValue(float(sampling["temperature"]))
            self.top_p.setValue(float(sampling["top_p"]))
            self.top_k.setValue(int(sampling["top_k"]))
            self.max_tokens.setValue(int(sampling.get("max_tokens") or 0))
            index = self.context_policy.findData(sampling.get("context_policy") or DROP_OLDEST)
            self.context_policy.setCurrentIndex(max(0, index))

    def show_model_defaults(self, text: str, usable: bool) -> None:
        self.model_defaults.setEnabled(usable)
        self.model_defaults_note.setText(text)

    def show_models_folder(self, folder: str | None, default: str, problem: str | None = None) -> None:
        """The folder kept (None: the default, shown greyed), and why a choice was refused."""
        self._folder = folder
        self.models_folder.setText(folder or "")
        self.models_folder.setPlaceholderText(default)
        self.default_folder.setEnabled(bool(folder))
        where = folder or default
        note = f"Downloads go to {where}, and the model setup page lists the models in it."
        if problem:
            colour = theme.colors()["error"]
            note = f"<span style='color:{colour}'><b>Not changed.</b> {problem}</span><br>{note}"
        self.folder_note.setText(note)

    def show_telemetry_interval(self, ms: int) -> None:
        with _quiet(self.telemetry):
            self.telemetry.setValue(ms)

    # -- values out -----------------------------------------------------------------------------------

    def sampling(self) -> dict:
        values = {
            "temperature": round(self.temperature.value(), 3),
            "top_p": round(self.top_p.value(), 3),
            "top_k": self.top_k.value(),
            "context_policy": self.context_policy.currentData(),
        }
        if self.max_tokens.value():
            values["max_tokens"] = self.max_tokens.value()
        return values

    def _choose_folder(self, text: str) -> None:
        text = text.strip()
        chosen = str(Path(text).expanduser()) if text else None
        if chosen == self._folder:
            return
        problem = folder_problem(text) if text else None
        if problem:
            self.show_models_folder(self._folder, self.models_folder.placeholderText(), problem)
            return
        self.models_folder_chosen.emit(chosen)

    def _browse(self) -> None:
        start = self._folder or self.models_folder.placeholderText()
        folder = QFileDialog.getExistingDirectory(self, "Models folder", start)
        if folder:
            self._choose_folder(folder)


def _row(*widgets: QWidget) -> QWidget:
    """Widgets side by side in one form row, the first taking the room."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    for index, widget in enumerate(widgets):
        layout.addWidget(widget, 1 if index == 0 else 0)
    return row


class _quiet:
    """Fields set from the kept values without announcing it as a choice."""

    def __init__(self, *widgets: QWidget):
        self.widgets = widgets

    def __enter__(self) -> None:
        self.blocked = [w.blockSignals(True) for w in self.widgets]

    def __exit__(self, *_exc) -> None:
        for widget, was in zip(self.widgets, self.blocked):
            widget.blockSignals(was)
