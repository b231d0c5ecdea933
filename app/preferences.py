"""The window's side of Settings (pages/app_settings.py): each value applied at once, kept with
store.set_setting, and applied again at the next start (`restore_preferences`, before the window's
widgets are built, so they are built at the text size kept). A base class of the window, as the
model setup flow is; the theme is the window's own (View → Theme), which Settings shows and sets.
"""

from __future__ import annotations

from flashdesk import paths
from flashdesk.app import font_size
from flashdesk.app.chat.settings_dialog import sampling_with_defaults
from flashdesk.app.pages.app_settings import AppSettings
from flashdesk.app.panels.telemetry import INTERVAL_RANGE_MS

# store.set_setting keys
FONT_SIZE = "font_size"  # points, or None: the system's
NEW_SAMPLING = "default_sampling"  # temperature, top_p, top_k, context_policy, max_tokens (absent: automatic)
MODELS_FOLDER = "models_folder"  # the Hugging Face cache downloads go to, or None: HF_HUB_CACHE or its default
TELEMETRY_MS = "telemetry_interval_ms"
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "context_policy")


class Preferences:
    """Mixed into MainWindow, which provides store, controller, session, remote, engine, sampler and
    the pages; `app_settings` is the Settings window once opened (one, shown again when asked for)."""

    app_settings: AppSettings | None = None

    def restore_preferences(self) -> None:
        """At start: the text size, new conversations' sampling, the models folder, the sampling rate."""
        size = font_size.clamp(self.store.setting(FONT_SIZE))
        if size:
            font_size.apply(size)
        kept = self.store.setting(NEW_SAMPLING)
        self.controller.new_sampling = {k: v for k, v in (kept or {}).items() if k in SAMPLING_KEYS}
        folder = self.store.setting(MODELS_FOLDER)
        self.session.models_folder = folder if isinstance(folder, str) and folder else None
        ms = self.store.setting(TELEMETRY_MS)
        if isinstance(ms, int) and not isinstance(ms, bool):
            self.sampler.set_interval(min(max(ms, INTERVAL_RANGE_MS[0]), INTERVAL_RANGE_MS[1]) / 1000)
        # a model loaded or gone (here or on a server): the defaults it recommends with it
        s, r = self.session, self.remote
        for signal in (s.state_changed, s.loaded, r.state_changed, r.connected):
            signal.connect(lambda _value: self._show_model_defaults())

    def show_app_settings(self) -> None:
        """File → Settings (Ctrl+,): the one Settings window, with the values as they are now."""
        page = self.app_settings
        if page is None:
            page = self.app_settings = AppSettings(self)
            page.theme_chosen.connect(self.set_theme)
            page.font_size_chosen.connect(self.set_font_size)
            page.sampling_chosen.connect(self.set_new_sampling)
            page.model_defaults_requested.connect(self._use_model_defaults)
            page.models_folder_chosen.connect(self.set_models_folder)
            page.server_requested.connect(self._server_from_settings)
            page.telemetry_interval_chosen.connect(self.set_telemetry_interval)
        page.show_theme(self.store.setting("theme", "system"))
        page.show_font_size(font_size.current())
        page.show_sampling(self._new_sampling_shown())
        self._show_model_defaults()
        page.show_models_folder(self.session.models_folder, str(paths.hub_cache_dir()))
        page.show_telemetry_interval(round(self.sampler.interval * 1000))
        page.show()
        page.raise_()
        page.activateWindow()

    def _new_sampling_shown(self) -> dict:
        """What a new conversation would start with now: the kept defaults, else the loaded model's, else
        ours; the reply length automatic unless one is kept (0 in the field)."""
        info = self.engine.info
        shown = sampling_with_defaults(self.controller.new_sampling, info.sampling_defaults if info else None)
        shown["max_tokens"] = self.controller.new_sampling.get("max_tokens", 0)
        return shown

    # -- each setting ---------------------------------------------------------------------------------

    def set_font_size(self, points: int | None) -> None:
        """The text size of the whole app (None: the system's); the chat is built again at it."""
        font_size.apply(points)
        self.store.set_setting(FONT_SIZE, points)
        if self.app_settings is not None and points is None:
            self.app_settings.show_font_size(font_size.current())
        conv = self.controller.conversation
        # a reply being written, or a message being edited (its editor's text would go), keeps its size
        # until the chat is next built
        if not self.controller.busy and not self.chat.editing():
            self.chat.set_messages(self.store.messages(conv.id) if conv else [])  # their text sized anew

    def set_new_sampling(self, changes: dict) -> None:
        """Fields new conversations start with (None: the loaded model's, or automatic, again); only
        the fields set are kept, so the others follow whichever model is loaded. The conversations
        there are keep their own."""
        kept = dict(self.controller.new_sampling)
        for key, value in changes.items():
            if value is None:
                kept.pop(key, None)
            else:
                kept[key] = value
        self.controller.new_sampling = kept
        self.store.set_setting(NEW_SAMPLING, kept)

    def _show_model_defaults(self) -> None:
        if self.app_settings is None:
            return
        info = self.engine.info
        if info is None:
            text, usable = "Load a model to start from the sampling it recommends.", False
        elif not info.sampling_defaults:
            text = f"No sampling is recommended for {info.name} (the engine reads it from generation_config.json)."
            usable = False
        else:
            named = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in info.sampling_defaults.items())
            text, usable = f"{info.name} recommends {named}.", True
        self.app_settings.show_model_defaults(text, usable)

    def _use_model_defaults(self) -> None:
        """Follow the loaded model's recommended sampling (generation_config.json; ours where it names
        none) again, whichever model that is, and the automatic reply length; the context policy
        stays (no model has a say in it)."""
        if self.app_settings is None:
            return
        self.set_new_sampling(dict.fromkeys(("temperature", "top_p", "top_k", "max_tokens")))
        self.app_settings.show_sampling(self._new_sampling_shown())

    def set_models_folder(self, folder: str | None) -> None:
        """Where downloads go and the setup page looks (None: the default): from the next survey or
        download on. Not while a download runs: its files would be split between two folders."""
        default = str(paths.hub_cache_dir())
        if self.downloading:
            if self.app_settings is not None:
                why = f"{self.downloading} is downloading: change the folder once it is done (or cancelled)."
                self.app_settings.show_models_folder(self.session.models_folder, default, why)
            return
        self.session.models_folder = folder
        self.store.set_setting(MODELS_FOLDER, folder)
        if self.app_settings is not None:
            self.app_settings.show_models_folder(folder, default)
        if self.pages.currentIndex() == 0:  # the setup page lists what is in the folder now
            self.session.survey(str(paths.demo_dir()))

    def set_telemetry_interval(self, ms: int) -> None:
        self.sampler.set_interval(ms / 1000)
        self.store.set_setting(TELEMETRY_MS, ms)

    def _server_from_settings(self) -> None:
        self.show_server_panel()
        self.raise_()
        self.activateWindow()
