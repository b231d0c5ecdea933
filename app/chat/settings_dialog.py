"""Per-conversation settings: the system prompt, sampling (temperature, top-p, top-k, max tokens,
thinking) and what to do when the conversation outgrows the context. Stored with the conversation
(in its sampling record), so each keeps its own. Shown in sections under plain headings, as chat
apps lay out their settings, rather than one long form."""

from __future__ import annotations

from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

DROP_OLDEST, STOP = "drop_oldest", "stop"  # protocol.Generate.context_policy
CONTEXT_POLICIES = {DROP_OLDEST: "Drop the oldest turns (keep the system prompt)", STOP: "Stop and tell me"}
DEFAULT_SAMPLING = {
    "temperature": 1.0,
    "top_p": 0.95,
    "top_k": 64,
    "max_tokens": 2048,
    "thinking": False,
    "context_policy": DROP_OLDEST,
}
HEADING_SCALE = 1.15
MAX_TOKENS_NOTE = (
    "Capped to what the context leaves: a reply never runs past the end of the context, so "
    "late in a long conversation it may get fewer tokens than this (its footer says so)."
)


def sampling_with_defaults(sampling: dict | None, model_defaults: dict | None = None) -> dict:
    """The conversation's sampling, its gaps filled from the model's defaults, then ours."""
    return {**DEFAULT_SAMPLING, **(model_defaults or {}), **(sampling or {})}


# The sampling fields, with the ranges a value can take: here and in the app's Settings (the defaults
# for new conversations), so both refuse the same values.


def _decimal_box(name: str, low: float, high: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setObjectName(name)
    box.setRange(low, high)
    box.setSingleStep(0.05)
    box.setDecimals(2)
    return box


def temperature_box() -> QDoubleSpinBox:
    return _decimal_box("temperature", 0.0, 2.0)


def top_p_box() -> QDoubleSpinBox:
    return _decimal_box("topP", 0.01, 1.0)


def top_k_box() -> QSpinBox:
    box = QSpinBox()
    box.setObjectName("topK")
    box.setRange(0, 100000)
    box.setSpecialValueText("off")
    return box


def context_policy_box() -> QComboBox:
    box = QComboBox()
    box.setObjectName("contextPolicy")
    for key, text in CONTEXT_POLICIES.items():
        box.addItem(text, key)
    box.setToolTip(
        "Drop the oldest turns: the model no longer sees the start of the "
        "conversation (it stays here). Stop: the turn is refused, and you can "
        "start a new conversation carrying the system prompt."
    )
    return box


def section_heading(title: str) -> QLabel:
    """A settings section's bold heading, a little larger than its fields."""
    heading = QLabel(title)
    heading.setObjectName("settingsHeading")
    font = QFont(heading.font())
    font.setBold(True)
    font.setPointSizeF(font.pointSizeF() * HEADING_SCALE)
    heading.setFont(font)
    return heading


def add_section(layout: QVBoxLayout, headings: list, title: str) -> QFormLayout:
    """A bold heading (kept in `headings`) and the form of its fields under it, spaced from the last."""
    heading = section_heading(title)
    if headings:
        layout.addSpacing(10)
    layout.addWidget(heading)
    headings.append(heading)
    form = QFormLayout()
    form.setContentsMargins(8, 0, 0, 0)
    layout.addLayout(form)
    return form


class ConversationSettings(QDialog):
    def __init__(
        self,
        title: str,
        system_prompt: str,
        sampling: dict,
        parent: QWidget | None = None,
        context_limit: int | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle(f"Settings — {title}")
        self.setObjectName("conversationSettings")
        self.system = QPlainTextEdit(system_prompt)
        self.system.setObjectName("systemPrompt")
        self.system.setPlaceholderText("Optional instructions the model reads before the conversation")
        self.system.setTabChangesFocus(True)
        self.temperature = temperature_box()
        self.top_p = top_p_box()
        self.top_k = top_k_box()
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("maxTokens")
        self.max_tokens.setRange(1, 262144)
        self.max_tokens.setToolTip(MAX_TOKENS_NOTE)
        self.max_tokens_note = QLabel(
            MAX_TOKENS_NOTE + (f" The model's context is {context_limit} tokens." if context_limit else "")
        )
        self.max_tokens_note.setObjectName("maxTokensNote")
        self.max_tokens_note.setWordWrap(True)
        self.thinking = QCheckBox("Let the model think before answering")
        self.thinking.setObjectName("thinking")
        self.context_policy = context_policy_box()

        s = sampling_with_defaults(sampling)
        self.temperature.setValue(float(s["temperature"]))
        self.top_p.setValue(float(s["top_p"]))
        self.top_k.setValue(int(s["top_k"]))
        self.max_tokens.setValue(int(s["max_tokens"]))
        self.thinking.setChecked(bool(s["thinking"]))
        index = self.context_policy.findData(s.get("context_policy", DROP_OLDEST))
        self.context_policy.setCurrentIndex(max(0, index))

        layout = QVBoxLayout(self)
        self.headings: list[QLabel] = []
        form = self._section(layout, "Conversation")
        form.addRow("System prompt", self.system)
        form = self._section(layout, "Sampling")
        form.addRow("Temperature", self.temperature)
        form.addRow(QLabel("0 is greedy: the same reply every time."))
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form = self._section(layout, "Reply")
        form.addRow("Max new tokens", self.max_tokens)
        form.addRow(self.max_tokens_note)
        form.addRow("", self.thinking)
        form = self._section(layout, "Context")
        form.addRow("When the conversation outgrows it", self.context_policy)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addStretch(1)
        layout.addWidget(buttons)
        self.resize(560, 560)

    def _section(self, layout: QVBoxLayout, title: str) -> QFormLayout:
        return add_section(layout, self.headings, title)

    def result_values(self) -> tuple[str, dict]:
        return self.system.toPlainText().strip(), {
            "temperature": round(self.temperature.value(), 3),
            "top_p": round(self.top_p.value(), 3),
            "top_k": self.top_k.value(),
            "max_tokens": self.max_tokens.value(),
            "thinking": self.thinking.isChecked(),
            "context_policy": self.context_policy.currentData(),
        }
