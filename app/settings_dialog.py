"""Per-conversation settings: the system prompt and sampling (temperature, top-p, top-k, max tokens,
thinking). Stored with the conversation, so each keeps its own."""

from __future__ import annotations

from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel,
                               QPlainTextEdit, QSpinBox, QVBoxLayout, QWidget)

DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 0.95, "top_k": 64, "max_tokens": 2048, "thinking": False}


def sampling_with_defaults(sampling: dict | None, model_defaults: dict | None = None) -> dict:
    """The conversation's sampling, its gaps filled from the model's defaults, then ours."""
    return {**DEFAULT_SAMPLING, **(model_defaults or {}), **(sampling or {})}


class ConversationSettings(QDialog):
    def __init__(self, title: str, system_prompt: str, sampling: dict, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Settings — {title}")
        self.setObjectName("conversationSettings")
        self.system = QPlainTextEdit(system_prompt)
        self.system.setObjectName("systemPrompt")
        self.system.setPlaceholderText("Optional instructions the model reads before the conversation")
        self.system.setTabChangesFocus(True)
        self.temperature = QDoubleSpinBox()
        self.temperature.setObjectName("temperature")
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setDecimals(2)
        self.top_p = QDoubleSpinBox()
        self.top_p.setObjectName("topP")
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setDecimals(2)
        self.top_k = QSpinBox()
        self.top_k.setObjectName("topK")
        self.top_k.setRange(0, 100000)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("maxTokens")
        self.max_tokens.setRange(1, 262144)
        self.thinking = QCheckBox("Let the model think before answering")
        self.thinking.setObjectName("thinking")

        s = sampling_with_defaults(sampling)
        self.temperature.setValue(float(s["temperature"]))
        self.top_p.setValue(float(s["top_p"]))
        self.top_k.setValue(int(s["top_k"]))
        self.max_tokens.setValue(int(s["max_tokens"]))
        self.thinking.setChecked(bool(s["thinking"]))

        form = QFormLayout()
        form.addRow("System prompt", self.system)
        form.addRow("Temperature", self.temperature)
        form.addRow(QLabel("0 is greedy: the same reply every time."))
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_tokens)
        form.addRow("", self.thinking)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
        self.resize(520, 420)

    def result_values(self) -> tuple[str, dict]:
        return self.system.toPlainText().strip(), {
            "temperature": round(self.temperature.value(), 3), "top_p": round(self.top_p.value(), 3),
            "top_k": self.top_k.value(), "max_tokens": self.max_tokens.value(),
            "thinking": self.thinking.isChecked()}
