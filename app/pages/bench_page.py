"""The Benchmark page: measure AR against DFlash on this card, by task type, and use what wins.

Why in the window: the speedup depends on the card, the task type and the draft length, so the
only honest answer to "which draft length?" is a measurement here. The run is the engine's own
bench (`flashdesk bench`, engine/bench/) through the worker: the built-in prompt sets, every mode
interleaved in one run, kept in the data folder. This page picks what to run, follows its progress
(Cancel stops it within one engine step), shows the chart and the table, lists earlier runs, and
"Use the best" sets the draft length (or auto) that the run found fastest.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from flashdesk import protocol as p
from flashdesk.app import theme
from flashdesk.app.backends.engine_session import READY, EngineSession
from flashdesk.app.panels.plots import GroupedBarPlot
from flashdesk.app.wheel_guard import wheel_only_when_focused

AUTO = p.AUTO_DRAFT_LENGTH
TASKS = ("code", "math", "reasoning", "chat", "summarization", "translation", "json")  # assets/prompts/
DRAFT_LENGTHS = (2, 4, 6, 8, 10, 12, 15)
DEFAULT_LENGTHS = {4, 8, 15, AUTO}
COLUMNS = ("Task", "Mode", "tok/s", "Speedup", "TTFT ms", "τ", "Accepted", "Mean K", "J/token")
AUTO_COLOUR = "#d95f02"
FIXED_COLOURS = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b", "#041d42")


def _num(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def time_left_text(done: int, total: int, elapsed: float) -> str:
    """The run's time left, from its own pace so far (the runs are alike: each prompt in each mode)."""
    if done <= 0 or total <= done:
        return ""
    left = elapsed / done * (total - done)
    if left < 60:
        return "under a minute left"
    minutes = round(left / 60)
    return f"about {minutes} minute{'s' if minutes != 1 else ''} left"


def summary_text(report: dict) -> str:
    """One paragraph: the fastest speculative mode over all task types against AR, auto's place, and
    whether every mode wrote the same text (it must)."""
    modes = report.get("modes", [])
    ar = next((m for m in modes if m.get("draft_length") == 0), None)
    chosen = _best(report)
    best = chosen["draft_length"] if chosen else None
    if ar is None or chosen is None:
        return "No speculative mode ran."
    text = (
        f"Fastest here over all task types: <b>{chosen['mode']}</b>, "
        f"<b>{chosen['speedup_over_ar']:.2f}×</b> plain decoding ({ar['tokens_per_second']:.0f} tok/s)."
    )
    fixed = [m for m in modes if m.get("draft_length") not in (0, AUTO)]
    auto = next((m for m in modes if m.get("draft_length") == AUTO and m.get("method") == chosen.get("method")), None)
    if auto is not None and best != AUTO and fixed:
        text += f" Auto: {auto['speedup_over_ar']:.2f}×."
    if chosen["speedup_over_ar"] < 1.0:
        text += " Speculation costs more than it saves on this card for these prompts."
    same = report.get("outputs_identical")
    text += " Outputs identical across modes: " + ("yes." if same else "<b>NO</b> (a bug: please report it).")
    return text


def _best(report: dict) -> dict | None:
    """The mode a run says to use: its best_mode (any method), or in runs from before there were two
    methods the DFlash mode of its best_draft_length."""
    modes = report.get("modes", [])
    named = (report.get("best_mode") or {}).get("mode")
    if named:
        return next((m for m in modes if m.get("mode") == named), None)
    best = report.get("best_draft_length")
    return next((m for m in modes if best is not None and m.get("draft_length") == best), None)


class BenchPage(QWidget):
    use_draft_length = Signal(object, object)  # "Use the best": an int or AUTO, and the method (None: any)
    back_requested = Signal()

    def __init__(self, session: EngineSession, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("benchPage")
        self.session = session
        self.running: str | None = None  # the request id of the run in flight
        self.started_at = 0.0  # time.monotonic() when it began: its pace gives the time left
        self.report: dict | None = None  # the run shown
        self.runs: list[dict] = []
        self.block_size: int | None = None
        self.loaded: tuple[str, str | None] | None = None  # the target and drafter folders loaded
        self.methods: list[str] = []  # the loaded draft models' methods
        self._build()
        session.bench_progress.connect(self._progress)
        session.bench_result.connect(self._result)
        session.bench_runs.connect(self._runs)
        session.error.connect(self._error)
        session.state_changed.connect(self._state_changed)
        self.set_model(None)

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        title = QLabel("Benchmark")
        title.setObjectName("benchTitle")
        font = title.font()
        font.setPointSizeF(font.pointSizeF() * 1.5)
        font.setBold(True)
        title.setFont(font)
        self.back = QPushButton("Back to chat")
        self.back.clicked.connect(self.back_requested)
        head = QHBoxLayout()
        head.addWidget(title, 1)
        head.addWidget(self.back)
        intro = QLabel(
            "Plain decoding (AR) and DFlash at each draft length, side by side on the loaded model: "
            "every prompt runs in every mode, interleaved, so the speedups are measured on this "
            "machine in one run. Which draft length pays depends on the card and the kind of text."
        )
        intro.setWordWrap(True)
        intro.setObjectName("muted")

        self.task_boxes = {t: QCheckBox(t) for t in TASKS}
        tasks_row = QHBoxLayout()
        for box in self.task_boxes.values():
            box.setChecked(True)
            box.toggled.connect(self._update_run)
            tasks_row.addWidget(box)
        tasks_row.addStretch(1)
        self.length_boxes = {k: QCheckBox("auto" if k == AUTO else str(k)) for k in (*DRAFT_LENGTHS, AUTO)}
        self.length_boxes[AUTO].setToolTip("Each step drafts what gives the most tokens per second")
        lengths_row = QHBoxLayout()
        for k, box in self.length_boxes.items():
            box.setChecked(k in DEFAULT_LENGTHS)
            box.toggled.connect(self._update_run)
            lengths_row.addWidget(box)
        lengths_row.addStretch(1)
        self.per_task = QSpinBox()
        self.per_task.setRange(1, 18)
        self.per_task.setValue(4)
        self.per_task.setToolTip("Prompts of each task type (our sets hold 17-18 each); more is steadier and slower")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(8, 2048)
        self.max_tokens.setSingleStep(32)
        self.max_tokens.setValue(128)
        for spin in (self.per_task, self.max_tokens):
            spin.setMaximumWidth(110)
        wheel_only_when_focused(self.per_task, self.max_tokens)
        form = QFormLayout()
        form.addRow("Task types", tasks_row)
        form.addRow("Draft lengths", lengths_row)
        form.addRow("Prompts per task type", self.per_task)
        form.addRow("New tokens per prompt", self.max_tokens)
        settings = QGroupBox("What to run")
        settings.setLayout(form)

        self.run_button = QPushButton("Run benchmark")
        self.run_button.setObjectName("runBench")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelBench")
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.status = QLabel()
        self.status.setObjectName("benchStatus")
        self.status.setWordWrap(True)
        run_row = QHBoxLayout()
        run_row.addWidget(self.run_button)
        run_row.addWidget(self.cancel_button)
        run_row.addWidget(self.progress, 4)
        run_row.addStretch(1)  # the buttons keep their size while no progress bar shows

        self.summary = QLabel("No run yet.")
        self.summary.setObjectName("benchSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.use_best = QPushButton("Use the best")
        self.use_best.setObjectName("useBest")
        self.use_best.clicked.connect(self._use_best)
        best_row = QHBoxLayout()
        best_row.addWidget(self.summary, 1)
        best_row.addWidget(self.use_best, 0, Qt.AlignmentFlag.AlignTop)
        self.chart = GroupedBarPlot("Decode speedup over AR by task type", "× AR", reference=1.0, height=240)
        self.chart.setObjectName("benchChart")
        self.chart.setMaximumHeight(300)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("benchTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setMinimumHeight(220)
        self.details = QLabel()
        self.details.setObjectName("muted")
        self.details.setWordWrap(True)
        results = QGroupBox("Results")
        results_layout = QVBoxLayout(results)
        results_layout.addLayout(best_row)
        results_layout.addWidget(self.chart)
        results_layout.addWidget(self.table)
        results_layout.addWidget(self.details)

        self.history = QListWidget()
        self.history.setObjectName("benchHistory")
        self.history.setMaximumHeight(150)
        self.history.currentRowChanged.connect(self._pick_run)
        earlier = QGroupBox("Earlier runs (every card and model, newest first)")
        QVBoxLayout(earlier).addWidget(self.history)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 16, 24, 16)
        layout.addLayout(head)
        layout.addWidget(intro)
        layout.addWidget(settings)
        layout.addLayout(run_row)
        layout.addWidget(self.status)
        layout.addWidget(results, 1)
        layout.addWidget(earlier)
        self.apply_theme()
        self._show_report(None)

    def apply_theme(self) -> None:
        self.setStyleSheet(f"QLabel#muted {{ color: {theme.colors()['muted']}; }}")
        self.chart.apply_theme()
        if self.report:
            self._show_report(self.report)

    # -- state ------------------------------------------------------------------------------------

    def set_model(self, info: p.Loaded | None) -> None:
        """The model now loaded (None: none): what can run, and the draft lengths its drafter allows."""
        self.block_size = info.block_size if info is not None else None
        self.loaded = (info.target, info.draft) if info is not None else None
        self.methods = list(info.methods) if info is not None else []
        longest = (self.block_size or 16) - 1
        for k, box in self.length_boxes.items():
            box.setEnabled(k == AUTO or k <= longest)
        if self.report:  # "Use the best" is for the pair loaded now
            self._show_report(self.report)
        self._update_run()

    def choices(self) -> tuple[list[str], list]:
        tasks = [t for t, box in self.task_boxes.items() if box.isChecked()]
        lengths = [k for k, box in self.length_boxes.items() if box.isChecked() and box.isEnabled()]
        return tasks, lengths

    def _why_not(self) -> str | None:
        """Why Run is off, or None when it can run."""
        if self.session.state != READY:
            return "Load a model with a draft model to benchmark it (File → Model setup, or try the demo)."
        if not self.block_size:
            return (
                "The loaded model has no draft model: the benchmark compares plain decoding with speculation "
                "(a DFlash drafter, Gemma 4's MTP assistant, or both)."
            )
        tasks, lengths = self.choices()
        if not tasks:
            return "Pick at least one task type."
        if not lengths:
            return "Pick at least one draft length (or auto)."
        return None

    def _update_run(self, *_args) -> None:
        reason = None if self.running else self._why_not()
        self.run_button.setEnabled(self.running is None and reason is None)
        self.run_button.setToolTip(reason or "")
        self.cancel_button.setEnabled(self.running is not None)
        self.progress.setVisible(self.running is not None)
        if self.running is None and reason:
            self.status.setText(reason)
        elif self.running is None and self.status.text().startswith(("Load a model", "The loaded", "Pick")):
            self.status.setText("")

    def _state_changed(self, state: str) -> None:
        if self.running and state != READY:  # the engine stopped (or unloaded) mid-run
            self.running = None
            self.status.setText("The engine stopped during the benchmark; this run was not kept.")
            self._no_longer_running()
        self._update_run()

    # -- running ----------------------------------------------------------------------------------

    def run(self) -> None:
        if self._why_not() or self.running:
            return
        tasks, lengths = self.choices()
        rid = self.session.bench(tasks, lengths, self.per_task.value(), self.max_tokens.value())
        if rid is None:
            return
        self.running = rid
        self.started_at = time.monotonic()
        self.progress.setRange(0, 0)
        methods = max(1, len(self.methods))
        modes = 1 + methods * len(lengths) + (1 if methods > 1 else 0)  # AR, each method's, the automatic method
        self.status.setText(
            f"Running {len(tasks)} task type(s) × {self.per_task.value()} prompt(s) in {modes} modes, up to "
            f"{self.max_tokens.value()} new tokens each: {len(tasks) * self.per_task.value() * modes} runs, each mode "
            "after a warm-up. The time left shows once the first runs are done."
        )
        if self.report is None:
            self.summary.setText("Running: the results appear here when the run ends.")
        self._update_run()

    def cancel(self) -> None:
        if self.running:
            self.session.cancel(self.running)
            self.cancel_button.setEnabled(False)
            self.status.setText("Cancelling after the step in flight…")

    def _progress(self, msg: p.BenchProgress) -> None:
        if msg.request_id != self.running:
            return
        self.progress.setRange(0, max(1, msg.total))
        self.progress.setValue(msg.done)
        left = time_left_text(msg.done, msg.total, time.monotonic() - self.started_at)
        self.progress.setFormat(f"%v / %m runs · {msg.text}" + (f" · {left}" if left else ""))

    def _result(self, msg: p.BenchResult) -> None:
        if msg.request_id != self.running:
            return
        self.running = None
        if msg.cancelled or msg.report is None:
            self.status.setText("Cancelled: nothing was kept from this run.")
            self._no_longer_running()
        else:
            self.status.setText(f"Done; kept in {msg.report.get('results_file', 'the data folder')}.")
            self._show_report(msg.report)
            self.session.bench_history()
        self._update_run()

    def _no_longer_running(self) -> None:
        """A run ended without a report: the summary no longer says one is going."""
        if self.report is None:
            self._show_report(None)

    def _error(self, err: p.Error) -> None:
        if err.during == "bench" and self.running:
            self.running = None
            self.status.setText(f"The benchmark failed: {err.message}")
            self._no_longer_running()
            self._update_run()

    # -- showing ----------------------------------------------------------------------------------

    def _show_report(self, report: dict | None) -> None:
        self.report = report
        ours = bool(report) and self.loaded == (report.get("model"), report.get("draft"))
        best = _best(report) if report else None
        method = (best or {}).get("method") or "dflash"
        usable = method in self.methods or (method == AUTO and len(self.methods) > 1)
        self.use_best.setEnabled(ours and best is not None and usable)
        if not ours:
            tip = "This run is of another model pair than the one loaded"
        elif best is not None and not usable:
            tip = f"The fastest mode, {best['mode']}, needs a draft model that is not loaded now"
        else:
            tip = "Set the chat's method and draft length (or auto) to the fastest mode of this run"
        self.use_best.setToolTip(tip)
        if not report:
            self.summary.setText("No run yet: pick what to run above and press Run.")
            self.chart.set_groups([], [])
            self.table.setRowCount(0)
            self.details.setText("")
            return
        self.summary.setText(summary_text(report))
        modes = report.get("modes", [])
        groups = list(report.get("tasks") or []) + ["all"]
        spec = [m for m in modes if m.get("draft_length") != 0]
        fixed = [m for m in spec if m.get("draft_length") != AUTO]
        series = []
        for m in spec:
            values = [
                (m["speedup_over_ar"] if g == "all" else m.get("by_task", {}).get(g, {}).get("speedup_over_ar")) or 0.0
                for g in groups
            ]
            colour = (
                AUTO_COLOUR
                if m["draft_length"] == AUTO
                else FIXED_COLOURS[
                    round(fixed.index(m) * (len(FIXED_COLOURS) - 1) / max(1, len(fixed) - 1)) if len(fixed) > 1 else 3
                ]
            )
            series.append((m["mode"], values, colour))
        self.chart.set_groups(groups, series)
        rows = [
            (task, m, m["by_task"][task])
            for task in report.get("tasks") or []
            for m in modes
            if task in m.get("by_task", {})
        ]
        rows += [("all tasks", m, m) for m in modes]
        self.table.setRowCount(len(rows))
        for r, (task, m, c) in enumerate(rows):
            ttft = c.get("ttft_seconds")
            speedup = c.get("speedup_over_ar")
            cells = (
                task,
                m["mode"],
                _num(c.get("tokens_per_second"), ".1f"),
                _num(speedup, ".2f") + ("×" if speedup is not None else ""),
                _num(None if ttft is None else ttft * 1000, ".1f"),
                _num(c.get("mean_acceptance_length"), ".2f"),
                _num(c.get("acceptance_rate"), ".0%"),
                _num(c.get("mean_draft_length"), ".1f"),
                _num(c.get("joules_per_token"), ".3f", "n/a"),
            )
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col >= 2:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if m.get("draft_length") == report.get("best_draft_length"):
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(r, col, item)
        self.details.setText(
            f"{report.get('model_name', '?')} + {report.get('draft_name', '?')} on {report.get('device_name', '?')} "
            f"({report.get('driver', '?')}), {report.get('dtype', '?')}, KV {report.get('kv_dtype', '?')}; "
            f"{report.get('prompts', 0)} prompts × up to {report.get('max_new_tokens', 0)} new tokens, greedy; "
            f"{str(report.get('date', ''))[:16].replace('T', ' ')}. Energy: {report.get('energy', 'n/a')}."
        )

    def _runs(self, msg: p.BenchRuns) -> None:
        self.runs = list(msg.runs)
        self.history.blockSignals(True)
        self.history.clear()
        for run in self.runs:
            best = _best(run)
            best_text = f"best {best['mode']} {best['speedup_over_ar']:.2f}×" if best else "no speculative mode"
            self.history.addItem(
                QListWidgetItem(
                    f"{str(run.get('date', '?'))[:16].replace('T', ' ')} · {run.get('device_name', '?')} · "
                    f"{run.get('model_name', '?')} + {run.get('draft_name', '?')} · {run.get('prompts', 0)} prompts · "
                    f"{best_text}"
                )
            )
        if self.report is None and self.runs:
            self.history.setCurrentRow(0)
            self._show_report(self.runs[0])
        self.history.blockSignals(False)
        if not self.runs:
            self.history.addItem("No runs kept yet.")
            self.history.item(0).setFlags(Qt.ItemFlag.NoItemFlags)

    def _pick_run(self, row: int) -> None:
        if 0 <= row < len(self.runs):
            self._show_report(self.runs[row])

    def _use_best(self) -> None:
        best = _best(self.report) if self.report else None
        if best is not None:
            method = best.get("method")
            self.use_draft_length.emit(best["draft_length"], method)
            self.status.setText(f"{best['mode']} set for the chat.")
