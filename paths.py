"""Where FlashDesk keeps its files: the platformdirs data folder, or FLASHDESK_DATA_DIR.

Why here, at the package root (`flashdesk.paths`): the app (the database, the demo model) and the
engine (`flashdesk bench` results, `--demo`) write under the same folder, and neither side may
import the other, so the one definition sits beside them, like `protocol.py`. Standard library
and platformdirs only: no torch, no Qt.

The override exists for tests, screenshots and portable setups: everything FlashDesk writes goes
under this one folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_DIR_NAME = "FlashDesk"
DATA_DIR_ENV = "FLASHDESK_DATA_DIR"
HUB_CACHE_ENV = "HF_HUB_CACHE"  # the models folder: where Hub models are downloaded and looked for


def data_dir() -> Path:
    explicit = os.environ.get(DATA_DIR_ENV)
    folder = Path(explicit).expanduser() if explicit else Path(platformdirs.user_data_dir(APP_DIR_NAME, False))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def database_path() -> Path:
    return data_dir() / "flashdesk.db"


def demo_dir() -> Path:
    return data_dir() / "demo"


def bench_dir() -> Path:
    """`flashdesk bench` results: one JSON file (and chart) per device, driver, model and drafter."""
    return data_dir() / "bench"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (huggingface_hub's rules): the
    models folder. Here because the engine downloads into it and the app's Settings show it."""
    explicit = os.environ.get(HUB_CACHE_ENV) or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def assets_dir() -> Path:
    return Path(__file__).resolve().parent / "assets"
