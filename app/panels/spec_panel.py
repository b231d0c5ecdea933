"""The speculation panel: on/off, the method (DFlash's drafter, Gemma 4's MTP assistant, or auto
when both are loaded), the draft length, and what speculation is achieving, live.

Leads with the mean acceptance length (tokens per target pass, the number that sets the speed-up)
rather than the acceptance rate, which looks poor for long drafts even when they pay off; shows
per-position acceptance and the histogram of accepted drafts per step; and offers to colour the
reply by origin (accepted draft token vs target token). Changes apply from the engine's next step.

With a server as the engine, the server's launch decides speculation (vLLM's
`num_speculative_tokens`, SGLang's `--speculative-num-draft-tokens`): the controls say so and are
off, and the figures are the server's, from its /metrics (n/a where it publishes none); what a
server does not tell (drafts per step, which tokens were drafted) is not shown.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from flashdesk.app import theme
from flashdesk.app.wheel_guard import wheel_only_when_focused
from flashdesk.protocol import AUTO_DRAFT_LENGTH as AUTO
from flashdesk.protocol import METHOD_NAMES
from flashdesk.app.panels.plots import BarPlot


def _pct(value) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) else "n/a"


class DraftLengthBox(QSpinBox):
    """The draft length: 1..K, or "auto" (shown at 0); typing "auto" (or its start) picks it, as
    arrowing below 1 does."""

    def validate(self, text: str, pos: int):
        typed = text.strip().lower()
        if typed and AUTO.startswith(typed):
            state = QValidator.State.Acceptable if typed == AUTO else QValidator.State.Intermediate
            return state, text, pos
        return super().validate(text, pos)

    def valueFromText(self, text: str) -> int:
        return self.minimum() if text.strip().lower() == AUTO else super().valueFromText(text)


METHOD_CHOICES = {
    "dflash": "DFlash drafter",
    "mtp": "MTP assistant",
    AUTO: "Auto: the fastest measured",
}


def method_figures(by_method: dict) -> str:
    """Each method's own acceptance, one line: "DFlash τ 3.10, 72% · MTP τ 1.80, 61%"."""
    parts = []
    for name, figures in by_method.items():
        tau = figures.get("mean_acceptance_length")
        tau_text = f"τ {tau:.2f}" if isinstance(tau, (int, float)) else "τ n/a"
        parts.append(f"{METHOD_NAMES.get(name, name)} {tau_text}, {_pct(figures.get('acceptance_rate'))}")
    return " · ".join(parts)


class SpecPanel(QGroupBox):
    speculation_changed = Signal(bool, object, object)  # enabled, draft length (an int or AUTO), method
    colour_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Speculative decoding", parent)
        self.setObjectName("specPanel")
        self.block_size: int | None = None
        self.enabled = QCheckBox("Speculate with the DFlash drafter")
        self.enabled.setObjectName("specEnabled")
        self.enabled.setToolTip(
            "The drafter proposes a block of tokens; the model checks them all in one pass. "
            "The text is the same either way, only the speed changes."
        )
        self.method = QComboBox()
        self.method.setObjectName("draftMethod")
        self.method.setToolTip(
            "Which draft model proposes the tokens: DFlash's drafter (a block in one pass) or Gemma 4's "
            "MTP assistant (one small step a token). Auto picks, each step, the method and draft length "
            "with the most expected tokens per second on this card. Applies from the next step"
        )
        self.length = DraftLengthBox()
        self.length.setObjectName("draftLength")
        self.length.setRange(0, 15)  # 0 shows as "auto"
        self.length.setSpecialValueText(AUTO)
        self.length.setValue(15)
        self.length.setToolTip(
            "Tokens drafted per step (1 to block size - 1), or auto (below 1): each step "
            "drafts what gives the most tokens per second, from this card's measured step "
            "times and the live acceptance. Applies from the next step"
        )
        wheel_only_when_focused(self.method, self.length)
        self.length_note = QLabel()
        self.length_note.setObjectName("muted")
        length_row = QHBoxLayout()
        length_row.addWidget(self.length)
        length_row.addWidget(self.length_note, 1)

        self.tau = QLabel("τ n/a")
        self.tau.setObjectName("tau")
        font = self.tau.font()
        font.setPointSizeF(font.pointSizeF() * 1.5)
        font.setBold(True)
        self.tau.setFont(font)
        self.tau.setToolTip("Mean acceptance length: tokens produced per target pass (accepted drafts + 1)")
        tau_caption = QLabel("mean acceptance length: tokens per target pass")
        tau_caption.setObjectName("muted")
        tau_caption.setWordWrap(True)
        self.rate = QLabel("n/a")
        self.rate.setObjectName("rate")
        self.counts = QLabel("n/a")
        self.counts.setObjectName("counts")
        self.by_method = QLabel()
        self.by_method.setObjectName("methodFigures")
        self.by_method.setToolTip("Each method's own mean acceptance length and acceptance rate")
        self.by_method.setWordWrap(True)
        self.by_method.hide()
        self.source = QLabel()
        self.source.setObjectName("specSource")
        self.source.setWordWrap(True)
        self.source.hide()
        self.scope = QLabel("No reply yet.")
        self.scope.setObjectName("muted")
        self.scope.setWordWrap(True)

        self.positions = BarPlot("Acceptance by draft position", "position", y_range=(0, 1), height=105)
        self.positions.setObjectName("positionPlot")
        self.histogram = BarPlot("Accepted drafts per step", "accepted", color_key="bar2", height=105)
        self.histogram.setObjectName("histogramPlot")

        self.colour = QCheckBox("Colour the reply by origin")
        self.colour.setObjectName("colourByOrigin")
        self.colour.setToolTip("Highlight the text of accepted draft tokens; the rest came from the model itself")
        self.legend = QLabel()
        self.legend.setObjectName("legend")
        self.legend.setWordWrap(True)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("Method", self.method)
        form.addRow("Draft length", length_row)
        form.addRow("Acceptance rate", self.rate)
        form.addRow("Accepted / drafted", self.counts)
        layout = QVBoxLayout(self)
        layout.addWidget(self.enabled)
        layout.addWidget(self.tau)
        layout.addWidget(tau_caption)
        layout.addLayout(form)
        layout.addWidget(self.by_method)
        layout.addWidget(self.source)
        layout.addWidget(self.scope)
        layout.addWidget(self.positions)
        layout.addWidget(self.histogram)
        layout.addWidget(self.colour)
        layout.addWidget(self.legend)
        self.apply_theme()

        self.enabled.toggled.connect(self._changed)
        self.length.valueChanged.connect(self._changed)
        self.method.currentIndexChanged.connect(self._changed)
        self.colour.toggled.connect(self.colour_changed)
        self.set_block_size(None)

    def apply_theme(self) -> None:
        c = theme.colors()
        self.legend.setText(
            f'<span style="background-color:{c["draft_bg"]}; color:{c["draft_fg"]};">'
            f"&nbsp;accepted draft&nbsp;</span> &nbsp;plain: chosen by the model"
        )
        self.setStyleSheet(f"QLabel#muted, QLabel#specSource {{ color: {c['muted']}; }}")
        for plot in (self.positions, self.histogram):
            plot.apply_theme()

    def set_methods(self, methods: list[str], current: str | None = None) -> None:
        """The loaded draft models' methods ([]: none), `current` chosen where it is one of them (or
        auto with two); the on/off switch names the method when there is one."""
        one = {"dflash": "the DFlash drafter", "mtp": "the Gemma 4 MTP assistant"}
        what = one.get(methods[0], "a draft model") if len(methods) == 1 else "a draft model"
        self.enabled.setText(f"Speculate with {what}")
        self.method.blockSignals(True)
        self.method.clear()
        for name in [*methods, AUTO] if len(methods) > 1 else methods:
            self.method.addItem(METHOD_CHOICES.get(name, name), name)
        index = self.method.findData(current) if current else -1
        self.method.setCurrentIndex(max(0, index) if methods else -1)
        self.method.setEnabled(len(methods) > 1)
        self.method.blockSignals(False)

    def set_block_size(self, block_size: int | None, enabled: bool = True, length: int | None = None) -> None:
        """A drafter with this block size is loaded (None: none is)."""
        self.block_size = block_size
        has = block_size is not None and block_size > 1
        for w in (self.enabled, self.length):
            w.blockSignals(True)
        if has:
            longest = block_size - 1
            self.length.setRange(0, longest)
            self.length.setValue(0 if length == AUTO else min(length or longest, longest))
            self.length_note.setText(f"max {longest}")
            self.length_note.setToolTip(f"The draft model drafts up to {longest} tokens a step")
            self.enabled.setChecked(enabled)
        else:
            self.enabled.setChecked(False)
            self.length_note.setText("no drafter loaded")
        self.enabled.setEnabled(has)
        self.length.setEnabled(has)
        for w in (self.enabled, self.length):
            w.blockSignals(False)

    def set_remote(self, server: str | None, speculates: bool = False, source: str = "") -> None:
        """A server (its name) is the engine: its launch decides speculation, so the controls are off and
        say so; `source` says where the figures come from. None: back to the local engine (then
        set_block_size sets the controls up again)."""
        for w in (self.enabled, self.length):
            w.blockSignals(True)
        remote = server is not None
        for w in (self.method, self.length, self.histogram, self.colour, self.legend):  # no per-step drafts
            w.setVisible(not remote)
        self.source.setVisible(remote)
        self.source.setText(source)
        if remote:
            self.enabled.setChecked(speculates)
            self.enabled.setEnabled(False)
            self.length.setEnabled(False)
            self.length_note.setText(f"set by {server}")
            self.length_note.setToolTip(
                "The server's launch sets speculation and the draft length: vLLM's "
                "num_speculative_tokens in --speculative-config, SGLang's "
                "--speculative-num-draft-tokens"
            )
        for w in (self.enabled, self.length):
            w.blockSignals(False)

    def _changed(self, *_args) -> None:
        self.speculation_changed.emit(*self.values())

    def show_stats(self, stats: dict | None, scope: str) -> None:
        """Show a stats record (the engine's running summary, or a stored message's)."""
        self.scope.setText(scope)
        stats = stats or {}
        tau = stats.get("mean_acceptance_length")
        self.tau.setText(f"τ = {tau:.2f} tokens/step" if isinstance(tau, (int, float)) else "τ n/a")
        self.rate.setText(_pct(stats.get("acceptance_rate")))
        drafted, accepted = stats.get("drafted"), stats.get("accepted")
        self.counts.setText(f"{accepted} / {drafted}" if drafted else "n/a")
        per_position = stats.get("per_position_acceptance") or []
        self.positions.set_bars(list(range(1, len(per_position) + 1)), per_position)
        histogram = stats.get("accepted_histogram") or []
        self.histogram.set_bars(list(range(len(histogram))), histogram)
        by_method = stats.get("by_method") or stats.get("methods") or {}
        self.by_method.setText(method_figures(by_method))
        self.by_method.setVisible(bool(by_method))

    def choose_method(self, method: str) -> None:
        """Select `method` where it is offered (quietly: the caller sends the settings)."""
        index = self.method.findData(method)
        if index >= 0:
            self.method.blockSignals(True)
            self.method.setCurrentIndex(index)
            self.method.blockSignals(False)

    def values(self) -> tuple[bool, int | str, str | None]:
        return self.enabled.isChecked(), self.length.value() or AUTO, self.method.currentData()
