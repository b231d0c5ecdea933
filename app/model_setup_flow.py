"""The window's model setup flow: check and load a local model, the recommended pair and its
downloads, the demo, and a server (vLLM, SGLang, another FlashDesk) as the engine instead.

Why apart from main_window.py: this is the part between "no model" and "ready", with its own
states (downloads queued, a server connecting), and it only reads and sets the window's parts.
MainWindow takes it as a base class; every method here works on the window's own attributes
(setup page, session, remote session, status bar, panels).
"""

from __future__ import annotations

from flashdesk import protocol as p
from flashdesk import paths
from flashdesk.app.backends.engine_session import LOADING, READY, STOPPED
from flashdesk.app.backends.openai_client import server_address
from flashdesk.app.backends.remote_session import ServerReading
from flashdesk.app.backends.server_metrics import SERVER_NAMES


class ModelSetupFlow:
    """The setup page's actions and the engine's answers to them (a mixin of MainWindow)."""

    # -- model setup ------------------------------------------------------------------------------------

    def check_model(self, sel: dict) -> None:
        if not sel["target"]:
            self.setup.show_error("Choose the model folder first.")
            return
        self.setup.set_busy("Checking the folders…")
        self.session.inspect(
            sel["target"], sel["draft"], sel["context"], sel.get("device", "auto"), sel.get("assistant")
        )

    def load_model(self, sel: dict) -> None:
        self._connect_after_check = None  # another engine chosen: a pending Connect is off
        if not sel["target"]:
            self.setup.show_error("Choose the model folder first.")
            return
        if self.engine.is_remote:
            self._leave_server()
        self.store.set_setting("model", sel)
        self.session.load(sel)
        self.show_chat()

    # -- a server as the engine ------------------------------------------------------------------------------

    def check_server(self, sel: dict) -> None:
        self._connect_after_check = None  # a plain check: whatever it finds, nothing switches
        self.setup.show_server_busy(f"Checking {sel['base_url'] or 'the address'}…")
        self.remote.check(sel["base_url"], sel.get("api_key"))

    def connect_server(self, sel: dict) -> None:
        """Chat with a server from now on (remembered for the next start). A reply streaming from the
        engine before is kept as stopped; the local model is unloaded to free its memory, once the
        server has answered a check: a wrong address leaves the working engine as it was."""
        try:
            server_address(sel.get("base_url") or "")
        except ValueError as exc:  # nothing to connect to: the engine stays as it is
            self.setup.show_server_error(str(exc))
            return
        if not self.engine.is_remote and self.session.state in (READY, LOADING):
            self._connect_after_check = sel
            self.setup.show_server_busy(f"Checking {sel['base_url']} (the local model stays until it answers)…")
            self.remote.check(sel["base_url"], sel.get("api_key"))
            return
        self._switch_to_server(sel)

    def server_checked(self, check) -> None:
        """A check answered: where it was asked before leaving a working engine, switch only if this
        server is there and serves the model asked for (the setup page shows the check either way)."""
        sel, self._connect_after_check = getattr(self, "_connect_after_check", None), None
        if sel is None or check.error or not check.models:
            return
        if check.address != server_address(sel["base_url"]).host or sel.get("model") not in ("", None, *check.models):
            return
        self._switch_to_server(sel)

    def _switch_to_server(self, sel: dict) -> None:
        self.controller.close()
        self.store.set_setting("remote", sel)
        self.store.set_setting("engine", "remote")
        self.engine.use(self.remote)
        if self.session.state in (READY, LOADING):
            self.session.unload()
        self.load_bar.hide()
        self.setup.set_busy(None)
        if not self.downloading:  # a local load's words would be stale
            self.setup.status.clear()
        for banner in (self.demo_banner, self.crash_banner, self.context_banner):
            banner.hide()
        self.composer.set_gauge(None)
        self.model_label.setText("")
        self.model_label.setToolTip("")
        self.bench.set_model(None)
        self.setup.show_server_busy(f"Connecting to {sel['base_url']}…")
        self.remote.connect_server(sel)
        if self.remote.host:
            self.telemetry.set_remote(self.remote.host)
        self.show_chat()

    def use_local_engine(self) -> None:
        """Back from a server to the local engine: the model last loaded here loads again."""
        self._connect_after_check = None  # another engine chosen: a pending Connect is off
        self._leave_server()
        model = self.store.setting("model")
        if model and model.get("target"):
            self.session.load(model)
            self.show_chat()
        else:
            self.show_setup()

    def _leave_server(self) -> None:
        """The local engine is the chat's again; nothing of the server stays on screen."""
        self.controller.close()
        self.remote.disconnect_server()
        self.engine.use(self.session)
        self.store.set_setting("engine", "local")
        self.setup.set_connected(None)
        self.spec.set_remote(None)
        self.spec.set_block_size(None)
        self.telemetry.set_remote(None)
        self.crash_banner.hide()
        self.model_label.setText("")
        self.model_label.setToolTip("")
        self._engine_state(self.session.state)

    def _remote_state(self, state: str) -> None:
        if not self.engine.is_remote:
            return
        where = (self.remote.settings or {}).get("base_url", "the server")
        if state == LOADING:
            self.engine_label.setText(f"Connecting to {where}…")
            self.composer.set_can_send(False, f"Connecting to {where}…")
        elif state == STOPPED:
            self.engine_label.setText(f"Not connected to {where}: File → Model setup → Connect to a server.")
            self.composer.set_can_send(False, "Not connected to the server (File → Model setup)")

    def _remote_connected(self, info: p.Loaded) -> None:
        if not self.engine.is_remote:
            return
        r = self.remote
        context = f" · context {info.context_limit:,} tokens" if info.context_limit else ""
        self.model_label.setText(f"{info.name} · {info.device_name}")
        self.model_label.setToolTip(f"{info.target}\n{info.name}, served by {info.device_name}{context}")
        self.engine_label.setText(f"Connected: {info.name} on {info.device_name}{context}")
        name = SERVER_NAMES.get(r.server, "the server")
        if r.speculates:
            source = f"Figures from {name}'s /metrics: all its requests, not only yours."
        elif r.has_metrics:
            source = f"The /metrics of {name} has no speculation figures: n/a."
        else:
            source = "This server publishes no /metrics: speculation figures are n/a."
        self.spec.set_remote(name, r.speculates, source)
        self.telemetry.set_remote(r.host)
        self.setup.set_connected(f"Connected to {info.device_name}: chatting with {info.name}.")
        self.crash_banner.hide()
        self.composer.set_can_send(True)

    def _remote_error(self, err: p.Error) -> None:
        if err.during == "connect":
            self.setup.show_server_error(err.message)
            if self.engine.is_remote:
                self.engine_label.setText(f"Not connected: {err.message}")
                self.crash_banner.show_text(f"<b>Not connected.</b> {err.message}", "Connect again", "error")
                self.crash_banner.close_button.setVisible(True)
            return
        if self.engine.is_remote:
            self.crash_banner.show_text(f"<b>Server error.</b> {err.message} Your conversation is kept.", None, "error")
            self.crash_banner.close_button.setVisible(True)

    def _server_reading(self, reading: ServerReading) -> None:
        if self.engine.is_remote:
            self.telemetry.set_server_rate(reading.tokens_per_second, reading.error)

    def start_recommended(self, sel: dict) -> None:
        """One click: download what of the recommended pair (and the MTP assistant, when chosen) is
        missing (a complete file is only checked), then load it."""
        repo_ids = [repo for repo in (sel["target"], sel["draft"], sel.get("assistant")) if repo]
        if self.setup.all_on_disk(repo_ids):
            self.load_model(sel)
            return
        self._load_after_download = True
        self.download_models(repo_ids)

    def download_models(self, repo_ids: list[str]) -> None:
        """Download the Hub ids one after the other in the engine process, then check the selection."""
        if not repo_ids or self.downloading:
            return
        self._downloads = list(repo_ids)
        self.setup.set_downloading(True)
        self._next_download()

    def _next_download(self) -> None:
        if not self._downloads:
            self.downloading = None
            self.setup.set_downloading(False)
            self.session.survey(str(paths.demo_dir()))  # what is on disk now
            if self._load_after_download:  # the recommended pair's one click: on to loading it
                self._load_after_download = False
                self.load_model(self.setup.selection())
            else:
                self.check_model(self.setup.selection())  # the memory check, now that the files are here
            return
        self.downloading = self._downloads.pop(0)
        self.setup.show_download(self.downloading, "", 0, 0)
        self.session.pull(self.downloading)

    def cancel_download(self) -> None:
        if self.downloading:
            self._downloads.clear()
            self._load_after_download = False
            self.setup.cancel_download_button.setEnabled(False)
            self.setup.status.setText(f"Stopping the download of {self.downloading}…")
            self.session.cancel_pull(self.downloading)

    def _pull_progress(self, msg: p.PullProgress) -> None:
        if msg.repo_id == self.downloading:
            self.setup.show_download(msg.repo_id, msg.file, msg.done_bytes, msg.total_bytes)

    def _pull_checked(self, msg: p.PullChecked) -> None:
        if msg.repo_id == self.downloading:
            self.setup.show_pull_check(msg.repo_id, msg.lines, msg.problems)

    def _pulled(self, msg: p.Pulled) -> None:
        if msg.repo_id == self.downloading:
            self.engine_label.setText(f"Downloaded {msg.repo_id} into {msg.folder}")
            self._next_download()

    def _pull_cancelled(self, msg: p.PullCancelled) -> None:
        if msg.repo_id != self.downloading:
            return
        self.downloading = None
        self._downloads.clear()
        self._load_after_download = False
        self.setup.set_downloading(False)
        kept = f" ({msg.done_bytes / 1e6:.1f} of {msg.total_bytes / 1e6:.1f} MB kept)" if msg.total_bytes else ""
        self.setup.status.setText(
            f"Download of {msg.repo_id} cancelled{kept}. Download again to continue where it stopped."
        )

    def start_demo(self) -> None:
        self._connect_after_check = None  # another engine chosen: a pending Connect is off
        self.setup.set_busy("Creating the demo model…")
        self.session.create_demo(str(paths.demo_dir()))

    def _demo_created(self, msg: p.DemoCreated) -> None:
        self.setup.set_busy(None)
        sel = {
            "target": msg.target,
            "draft": msg.draft,
            "device": "cpu",
            "context": 4096,
            "kv_dtype": "auto",
            "dtype": "auto",
            "demo": True,
        }
        self.setup.set_selection(sel)
        self.load_model(sel)
