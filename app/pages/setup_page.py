"""The model setup page: pick the target and its draft models (a DFlash drafter, Gemma 4's MTP
assistant, or both), see the memory plan, load; or the demo.

The check runs in the engine process (the loader's own checks, no weights read), so the window
never imports torch. A model can be named by folder or by Hugging Face id. An id that is not in
the local Hub cache yet is downloaded by the engine process too (Download): the page shows the
bytes on disk out of the model's total and the file in flight, and Cancel stops the download
with the partial weights kept, so that the next Download continues them.

Below, "Connect to a server": instead of a local model, a vLLM or SGLang server (for more than one
card, or several users) or another FlashDesk (`flashdesk serve`), at an OpenAI-compatible address.
Check lists the models it serves and says whether its /metrics has speculation figures; Connect
makes it the chat's engine; "Use the local engine" goes back.
"""

from __future__ import annotations

import html

import re
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QTextDocumentFragment
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from flashdesk.app import theme
from flashdesk.app.wheel_guard import wheel_only_when_focused

DEMO_TEXT = (
    "<b>The demo</b> copies a tiny Gemma 4 model and DFlash drafter trained for "
    "FlashDesk (about 6 MB) into FlashDesk's data folder and runs them on the CPU. <b>It is a toy</b>: "
    "2.4 million parameters trained on Python's source and our docs, it writes text that looks like "
    "code or English and is rarely right. The demo shows how the app works (streaming, speculation "
    "statistics, telemetry), not what Gemma can do."
)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as engine/hub/models.py's REPO_ID


def hub_id(text: str) -> str | None:
    """`text` when it names a Hugging Face model (org/name) and no folder of that name exists."""
    text = text.strip()
    if not HUB_ID.fullmatch(text) or Path(text).expanduser().is_dir():
        return None
    return text


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class SetupPage(QWidget):
    check_requested = Signal(dict)  # {"target", "draft", "context"}
    load_requested = Signal(dict)  # the load settings
    demo_requested = Signal()
    cancel_requested = Signal()
    download_requested = Signal(list)  # the Hub ids of the Model and Drafter fields to download
    download_cancel_requested = Signal()
    # the load settings of the recommended pair, with the MTP assistant when its box is ticked
    # (download first if needed)
    recommended_requested = Signal(dict)
    server_check_requested = Signal(dict)  # {"base_url", "api_key"}
    server_connect_requested = Signal(dict)  # {"base_url", "api_key", "model"}
    local_requested = Signal()  # back from a server to the local engine

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("setupPage")
        title = QLabel("<h2>Set up a model</h2>")
        intro = QLabel(
            "FlashDesk runs Gemma 4 (the target) and a DFlash drafter for speculative decoding. "
            "Choose their folders, or type their Hugging Face ids (<code>org/name</code>) and "
            "press Download if they are not on this computer yet."
        )
        intro.setWordWrap(True)

        self.target = QLineEdit()
        self.target.setObjectName("targetPath")
        self.target.setPlaceholderText("folder or Hub id of the Gemma 4 model, e.g. ~/models/gemma-4-26B-A4B-it")
        self.draft = QLineEdit()
        self.draft.setObjectName("draftPath")
        self.draft.setPlaceholderText("folder or Hub id of the DFlash drafter or the Gemma 4 MTP assistant (optional)")
        self.assistant = QLineEdit()
        self.assistant.setObjectName("assistantPath")
        self.assistant.setPlaceholderText(
            "and Gemma 4's MTP assistant beside a DFlash drafter, to compare the two (optional)"
        )
        self.device = QComboBox()
        self.device.setObjectName("device")
        self.device.addItems(["auto", "cuda", "cpu"])
        self.context = QSpinBox()
        self.context.setObjectName("context")
        self.context.setRange(256, 262144)
        self.context.setSingleStep(1024)
        self.context.setValue(32768)
        self.context.setSuffix(" tokens")
        self.kv_dtype = QComboBox()
        self.kv_dtype.setObjectName("kvDtype")
        self.kv_dtype.addItems(["auto", "fp8", "bfloat16", "float32"])

        wheel_only_when_focused(self.device, self.context, self.kv_dtype)
        self.on_disk = QComboBox()
        self.on_disk.setObjectName("onDisk")
        self.on_disk.setToolTip(
            "Models already on this computer (as `flashdesk models list` shows them): a pick fills the fields below"
        )
        self.on_disk.activated.connect(self._pick_on_disk)
        wheel_only_when_focused(self.on_disk)
        form = QFormLayout()
        form.addRow("On this computer", self.on_disk)
        form.addRow("Model", self._with_browse(self.target, "Choose the Gemma 4 model folder"))
        form.addRow("Drafter", self._with_browse(self.draft, "Choose the DFlash drafter or MTP assistant folder"))
        form.addRow("MTP assistant", self._with_browse(self.assistant, "Choose the Gemma 4 MTP assistant folder"))
        form.addRow("Device", self.device)
        form.addRow("Context", self.context)
        form.addRow("KV cache", self.kv_dtype)

        self.check_button = QPushButton("Check and estimate memory")
        self.check_button.setObjectName("checkButton")
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("loadButton")
        self.load_button.setDefault(True)
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("downloadButton")
        self.download_button.setToolTip(
            "Download the Hugging Face ids above into the Hugging Face cache (an "
            "interrupted download continues; one already complete is only checked)"
        )
        self.download_button.hide()
        self.cancel_download_button = QPushButton("Cancel download")
        self.cancel_download_button.setObjectName("cancelDownloadButton")
        self.cancel_download_button.hide()
        self.downloading = False
        self.cancel_button = QPushButton("Back to the chat")
        self.cancel_button.setObjectName("backButton")
        buttons = QHBoxLayout()
        buttons.addWidget(self.check_button)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_download_button)
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.load_button)

        self.plan = QPlainTextEdit()
        self.plan.setObjectName("memoryPlan")
        self.plan.setReadOnly(True)
        self.plan.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.plan.setPlaceholderText("The check of the folders and the memory plan appear here.")
        self._plan_is_error = False  # the box holds an error, not a check's lines
        self.plan.setMinimumHeight(160)
        self.status = QLabel()
        self.status.setObjectName("setupStatus")
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setObjectName("setupProgress")
        self.progress.hide()

        recommended = QGroupBox("Recommended for an NVIDIA GPU")
        recommended.setObjectName("recommendedBox")
        self.recommended_text = QLabel(
            "<b>Gemma 4 26B-A4B</b> (4-bit) and its <b>DFlash drafter</b>: the pair FlashDesk is built for."
        )
        self.recommended_text.setWordWrap(True)
        self.fit = QLabel("Checking this computer…")
        self.fit.setObjectName("recommendedFit")
        self.fit.setWordWrap(True)
        self.recommended_button = QPushButton("Download and load")
        self.recommended_button.setObjectName("recommendedButton")
        self.recommended_button.setEnabled(False)
        self.with_assistant = QCheckBox("and Gemma 4's MTP assistant, to compare")
        self.with_assistant.setObjectName("recommendedAssistant")
        self.with_assistant.hide()  # until the survey offers it
        self.with_assistant.toggled.connect(self._show_recommended_fit)
        text_column = QVBoxLayout()
        text_column.addWidget(self.recommended_text)
        text_column.addWidget(self.with_assistant)
        text_column.addWidget(self.fit)
        recommended_layout = QHBoxLayout(recommended)
        recommended_layout.addLayout(text_column, 1)
        recommended_layout.addWidget(self.recommended_button, 0, Qt.AlignmentFlag.AlignVCenter)
        self.survey: dict | None = None  # the last Surveyed, as a dict
        self.pull_problem = ""  # why the model being downloaded would be refused (PullChecked)

        demo = QGroupBox("Demo")
        self.demo_text = QLabel(DEMO_TEXT)
        self.demo_text.setWordWrap(True)
        self.demo_button = QPushButton("Try the demo model")
        self.demo_button.setObjectName("demoButton")
        demo_layout = QHBoxLayout(demo)
        demo_layout.addWidget(self.demo_text, 1)
        demo_layout.addWidget(self.demo_button, 0, Qt.AlignmentFlag.AlignVCenter)

        server = self._server_box()

        column = QVBoxLayout()
        column.addWidget(title)
        column.addWidget(recommended)
        column.addWidget(intro)
        column.addLayout(form)
        column.addLayout(buttons)
        column.addWidget(self.status)
        column.addWidget(self.progress)
        column.addWidget(self.plan, 1)
        column.addWidget(demo)
        column.addWidget(server)
        frame = QFrame()
        frame.setMaximumWidth(860)
        frame.setLayout(column)
        outer = QHBoxLayout(self)
        outer.addStretch(1)
        outer.addWidget(frame, 8)
        outer.addStretch(1)

        self.check_button.clicked.connect(lambda: self.check_requested.emit(self.selection()))
        self.load_button.clicked.connect(lambda: self.load_requested.emit(self.selection()))
        self.demo_button.clicked.connect(self.demo_requested)
        self.recommended_button.clicked.connect(self._recommended_clicked)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.target.returnPressed.connect(lambda: self.check_requested.emit(self.selection()))
        self.download_button.clicked.connect(lambda: self.download_requested.emit(self.hub_ids()))
        self.cancel_download_button.clicked.connect(self.download_cancel_requested)
        self.target.textChanged.connect(self._update_download)
        self.draft.textChanged.connect(self._update_download)
        self.assistant.textChanged.connect(self._update_download)
        for signal in (
            self.target.textChanged,
            self.draft.textChanged,
            self.assistant.textChanged,
            self.device.currentIndexChanged,
            self.context.valueChanged,
            self.kv_dtype.currentIndexChanged,
        ):
            signal.connect(self.clear_check)

    def _server_box(self) -> QGroupBox:
        box = QGroupBox("Connect to a server")
        box.setObjectName("serverBox")
        text = QLabel(
            "Outgrown one card? Run Gemma 4 with DFlash on vLLM or SGLang (or another FlashDesk with "
            "<code>flashdesk serve</code>) and chat with it from here: any OpenAI-compatible address."
        )
        text.setWordWrap(True)
        self.server_url = QLineEdit()
        self.server_url.setObjectName("serverUrl")
        self.server_url.setPlaceholderText(
            "http://127.0.0.1:8000/v1 (vLLM), …:30000/v1 (SGLang), …:8719/v1 (FlashDesk)"
        )
        self.server_key = QLineEdit()
        self.server_key.setObjectName("serverKey")
        self.server_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_key.setPlaceholderText("API key, if the server asks for one")
        self.server_key.setToolTip(
            "Sent as a bearer token. FlashDesk keeps it in its local database on this "
            "computer (in plain text), to connect again at the next start."
        )
        self.server_model = QComboBox()
        self.server_model.setObjectName("serverModel")
        self.server_model.setEditable(True)
        self.server_model.setToolTip(
            "The model to chat with; Check lists the ones the server serves (empty: its first)"
        )
        wheel_only_when_focused(self.server_model)
        form = QFormLayout()
        form.addRow("Address", self.server_url)
        form.addRow("API key", self.server_key)
        form.addRow("Model", self.server_model)
        self.server_check_button = QPushButton("Check")
        self.server_check_button.setObjectName("serverCheckButton")
        self.server_check_button.setToolTip("List the server's models and look for speculation figures in its /metrics")
        self.server_connect_button = QPushButton("Connect")
        self.server_connect_button.setObjectName("serverConnectButton")
        self.local_button = QPushButton("Use the local engine")
        self.local_button.setObjectName("localEngineButton")
        self.local_button.setToolTip("Disconnect from the server and load the model last loaded on this computer")
        self.local_button.hide()
        row = QHBoxLayout()
        row.addWidget(self.server_check_button)
        row.addStretch(1)
        row.addWidget(self.local_button)
        row.addWidget(self.server_connect_button)
        self.server_status = QLabel()
        self.server_status.setObjectName("serverStatus")
        self.server_status.setWordWrap(True)
        self.server_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(box)
        layout.addWidget(text)
        layout.addLayout(form)
        layout.addLayout(row)
        layout.addWidget(self.server_status)
        self.server_check_button.clicked.connect(lambda: self.server_check_requested.emit(self.server_selection()))
        self.server_connect_button.clicked.connect(lambda: self.server_connect_requested.emit(self.server_selection()))
        self.server_url.returnPressed.connect(lambda: self.server_check_requested.emit(self.server_selection()))
        self.local_button.clicked.connect(self.local_requested)
        return box

    def server_selection(self) -> dict:
        return {
            "base_url": self.server_url.text().strip(),
            "api_key": self.server_key.text().strip(),
            "model": self.server_model.currentText().strip(),
        }

    def set_server_selection(self, settings: dict) -> None:
        self.server_url.setText(settings.get("base_url") or "")
        self.server_key.setText(settings.get("api_key") or "")
        self.server_model.setEditText(settings.get("model") or "")

    def show_server_busy(self, text: str) -> None:
        self.server_status.setStyleSheet("")
        self.server_status.setText(text)

    def show_server_check(self, check) -> None:
        """What Check found (remote_session.ServerCheck): the models to pick from, or the error."""
        if check.error:
            self.show_server_error(check.error)
            return
        chosen = self.server_model.currentText().strip()
        self.server_model.clear()
        for model in check.models:
            limit = check.context.get(model)
            self.server_model.addItem(model)
            if limit:
                self.server_model.setItemData(
                    self.server_model.count() - 1, f"context {limit:,} tokens", Qt.ItemDataRole.ToolTipRole
                )
        self.server_model.setEditText(chosen if chosen in check.models else (check.models[0] if check.models else ""))
        self.show_server_busy(check.text)

    def show_server_error(self, text: str) -> None:
        self.server_status.setStyleSheet(f"color: {theme.colors()['error']};")
        self.server_status.setText(text)

    def set_connected(self, text: str | None) -> None:
        """Connected to a server (`text` says which), or not (None): "Use the local engine" shows then."""
        self.local_button.setVisible(text is not None)
        if text is not None:
            self.show_server_busy(text)

    def clear_check(self, *_args) -> None:
        """A field changed: the last check and memory plan speak of other settings, so they go."""
        if self.plan.toPlainText() or self.status.text():
            self.plan.clear()
            if not self.progress.isVisible() and not self.downloading:
                self.status.setStyleSheet("")
                self.status.setText("")

    def _with_browse(self, edit: QLineEdit, caption: str) -> QWidget:
        button = QPushButton("Browse…")
        button.clicked.connect(lambda: self._browse(edit, caption))
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(edit, 1)
        layout.addWidget(button)
        return row

    def _browse(self, edit: QLineEdit, caption: str) -> None:
        folder = QFileDialog.getExistingDirectory(self, caption, edit.text() or "")
        if folder:
            edit.setText(folder)

    def hub_ids(self) -> list[str]:
        """The Hugging Face ids in the Model, Drafter and MTP assistant fields (not folders), each once."""
        ids = [hub_id(edit.text()) for edit in (self.target, self.draft, self.assistant)]
        return list(dict.fromkeys(i for i in ids if i))

    def _update_download(self) -> None:
        self.download_button.setVisible(bool(self.hub_ids()) and not self.downloading)

    def set_downloading(self, on: bool) -> None:
        """Downloading: a measured progress bar and Cancel; the fields and other actions wait."""
        self.downloading = on
        fields = (self.target, self.draft, self.assistant, self.on_disk)
        for w in (self.check_button, self.load_button, self.demo_button, *fields):
            w.setEnabled(not on)
        self.recommended_button.setEnabled(not on and bool(self.survey and self.recommended_fit()["fits"]))
        self.with_assistant.setEnabled(not on)
        self.cancel_download_button.setVisible(on)
        self.cancel_download_button.setEnabled(on)
        self._update_download()
        self.progress.setVisible(on)
        if on:
            self.pull_problem = ""
            self.status.setStyleSheet("")
            self.progress.setRange(0, 0)  # until the first sizes arrive

    def show_download(self, repo_id: str, file: str, done: int, total: int) -> None:
        """The bytes of `repo_id` on disk out of its total, and the file in flight."""
        if total <= 0:
            self.progress.setRange(0, 0)
            self.status.setText(
                f"Downloading {repo_id}: the file list and the small files (config, tokenizer), then the weights…"
            )
            return
        self.progress.setRange(0, 1000)
        self.progress.setValue(min(1000, done * 1000 // total))
        where = f" · {file}" if file else ""
        warning = f"<br>{html.escape(self.pull_problem)}" if self.pull_problem else ""
        self.status.setText(
            f"Downloading {html.escape(repo_id)}: {_size(done)} of {_size(total)}{html.escape(where)}{warning}"
        )

    def show_pull_check(self, repo_id: str, lines: list[str], problems: list[str]) -> None:
        """What the engine would make of the model being downloaded, known from its configs and
        weights headers before the weights are in: a refusal shows under the progress at once."""
        self.plan.setPlainText(
            f"{repo_id}, checked before its weights are downloaded (configs and "
            "safetensors headers only):\n\n" + "\n".join(lines)
        )
        if problems:
            self.pull_problem = (
                "FlashDesk would refuse this model: " + "; ".join(problems) + " Cancel to stop the download."
            )
            self.status.setStyleSheet(f"color: {theme.colors()['error']};")

    def selection(self) -> dict:
        return {
            "target": self.target.text().strip(),
            "draft": self.draft.text().strip() or None,
            "assistant": self.assistant.text().strip() or None,
            "device": self.device.currentText(),
            "context": self.context.value(),
            "kv_dtype": self.kv_dtype.currentText(),
            "dtype": "auto",
        }

    def set_selection(self, settings: dict) -> None:
        self.target.setText(settings.get("target") or "")
        self.draft.setText(settings.get("draft") or "")
        self.assistant.setText(settings.get("assistant") or "")
        for combo, key in ((self.device, "device"), (self.kv_dtype, "kv_dtype")):
            index = combo.findText(settings.get(key) or "auto")
            combo.setCurrentIndex(max(0, index))
        self.context.setValue(int(settings.get("context") or 32768))

    def show_survey(self, survey: dict) -> None:
        """The recommended pair's fit on this card (before downloading), the MTP assistant offered
        beside it (when the survey has it), and the models on disk."""
        self.survey = survey
        target_id, draft_id = survey["recommended"]
        on_disk = self.all_on_disk(survey["recommended"])
        size = f"about {survey['download_bytes'] / 1e9:.0f} GB to download"
        self.recommended_text.setText(
            f"<b>Gemma 4 26B-A4B</b> (4-bit) and its <b>DFlash drafter</b>: "
            f"<code>{target_id}</code> and <code>{draft_id}</code>, "
            f"{'already on this computer' if on_disk else size}."
        )
        assistant = survey.get("assistant")
        self.with_assistant.setVisible(bool(assistant))
        if assistant:
            here = self.all_on_disk([assistant["repo"]])
            size = "on this computer" if here else f"{assistant['download_bytes'] / 1e9:.1f} GB"
            self.with_assistant.setText(f"and Gemma 4's MTP assistant, to compare ({size})")
            self.with_assistant.setToolTip(
                f"{assistant['repo']}: Google's own drafter for this model, loaded beside the DFlash "
                "drafter (the MTP assistant field); the speculation panel then chooses between them"
            )
        self._show_recommended_fit()
        self.on_disk.clear()
        models = [m for m in survey["models"] if m.get("complete")]
        self.on_disk.addItem(f"{len(models)} model(s) found: pick one…" if models else "none yet", None)
        for m in models:
            names = {"demo": "demo pair", "drafter": "DFlash drafter", "assistant": "MTP assistant", "target": "model"}
            kind = names.get(m["kind"], m["kind"])
            size = f", {m['size'] / 1e9:.1f} GB" if m.get("size") else ""
            self.on_disk.addItem(f"{m['name']} ({kind}{size})", m)
        self.on_disk.setEnabled(bool(models))

    def wants_assistant(self) -> bool:
        """Whether the one click takes the MTP assistant too (offered by the survey, box ticked)."""
        return bool(self.survey and self.survey.get("assistant") and self.with_assistant.isChecked())

    def recommended_fit(self) -> dict:
        """The fit (fits, context, text…) of what the one click loads: the pair, or with the assistant."""
        return self.survey["assistant"] if self.wants_assistant() else self.survey

    def recommended_ids(self) -> list[str]:
        """The Hub ids the one click downloads and loads."""
        if not self.survey:
            return []
        assistant = [self.survey["assistant"]["repo"]] if self.wants_assistant() else []
        return list(self.survey["recommended"]) + assistant

    def _show_recommended_fit(self, *_args) -> None:
        if not self.survey:
            return
        fit = self.recommended_fit()
        muted = "error" if self.survey["device_name"] else "muted"
        self.fit.setStyleSheet("" if fit["fits"] else f"color: {theme.colors()[muted]};")
        self.fit.setText(fit["text"])
        self.recommended_button.setText("Load" if self.all_on_disk(self.recommended_ids()) else "Download and load")
        self.recommended_button.setEnabled(fit["fits"] and not self.downloading)
        self.recommended_button.setToolTip("" if fit["fits"] else fit["text"])

    def all_on_disk(self, repo_ids) -> bool:
        """Whether every one of these Hub ids is complete on this computer (by the last survey)."""
        names = {m["name"] for m in (self.survey or {}).get("models", []) if m.get("complete")}
        return all(repo in names for repo in repo_ids)

    def _pick_on_disk(self, index: int) -> None:
        entry = self.on_disk.itemData(index)
        if not entry:
            return
        if entry.get("target"):
            self.target.setText(entry["target"])
        draft = entry.get("draft")
        beside = self.draft.text().strip() not in ("", draft)
        if draft and entry["kind"] == "assistant" and beside:  # beside the drafter already chosen
            self.assistant.setText(draft)
        elif draft:
            self.draft.setText(draft)
        if entry["kind"] == "demo":
            self.device.setCurrentText("cpu")
            self.context.setValue(4096)

    def _recommended_clicked(self) -> None:
        if not self.survey or not self.recommended_fit()["fits"]:
            return
        target_id, draft_id = self.survey["recommended"]
        sel = {
            "target": target_id,
            "draft": draft_id,
            "assistant": self.survey["assistant"]["repo"] if self.wants_assistant() else None,
            "device": "auto",
            "context": self.recommended_fit()["context"],
            "kv_dtype": "auto",
            "dtype": "auto",
        }
        self.set_selection(sel)
        self.recommended_requested.emit(sel)

    def show_plan(self, lines: list[str], problems: list[str]) -> None:
        self.plan.setPlainText("\n".join(lines))
        self._plan_is_error = False
        c = theme.colors()
        if problems:
            self.status.setStyleSheet(f"color: {c['error']};")
            self.status.setText("Not usable: " + "; ".join(problems))
        else:
            self.status.setStyleSheet("")
            self.status.setText("The folders hold a model FlashDesk can load. Memory plan below.")

    def set_busy(self, text: str | None, fraction: float = -1.0) -> None:
        """Show progress (fraction < 0: busy without a measure), or None when done."""
        busy = text is not None
        for w in (self.check_button, self.load_button, self.demo_button):
            w.setEnabled(not busy)
        self.progress.setVisible(busy)
        if busy:
            self.status.setStyleSheet("")
            self.status.setText(text)
            if fraction < 0:
                self.progress.setRange(0, 0)
            else:
                self.progress.setRange(0, 100)
                self.progress.setValue(int(fraction * 100))

    def show_error(self, text: str) -> None:
        if self.downloading:
            self.set_downloading(False)
        self.set_busy(None)
        self.status.setStyleSheet(f"color: {theme.colors()['error']};")
        self.status.setText(text)
        if not self.plan.toPlainText() or self._plan_is_error:  # not a check's lines: the error, there too
            self.plan.setPlainText(QTextDocumentFragment.fromHtml(text).toPlainText())
            self._plan_is_error = True

    def set_can_go_back(self, on: bool) -> None:
        self.cancel_button.setVisible(on)
