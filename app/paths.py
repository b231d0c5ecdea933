"""Where FlashDesk keeps its files: the platformdirs data folder, or FLASHDESK_DATA_DIR.

The override exists for tests, screenshots and portable setups: everything the app writes (the
database, the demo model) goes under this one folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_DIR_NAME = "FlashDesk"
DATA_DIR_ENV = "FLASHDESK_DATA_DIR"


def data_dir() -> Path:
    explicit = os.environ.get(DATA_DIR_ENV)
    folder = Path(explicit).expanduser() if explicit else Path(platformdirs.user_data_dir(APP_DIR_NAME, False))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def database_path() -> Path:
    return data_dir() / "flashdesk.db"


def demo_dir() -> Path:
    return data_dir() / "demo"


def assets_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "assets"
