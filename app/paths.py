"""Where FlashDesk keeps its files: re-exported from `flashdesk.paths`, which the engine shares.

The definitions live at the package root so that `flashdesk bench` (engine) and the app write
under the same data folder (FLASHDESK_DATA_DIR or the platformdirs one) without either layer
importing the other.
"""

from __future__ import annotations

from flashdesk.paths import (  # noqa: F401 - this module's API
    APP_DIR_NAME,
    DATA_DIR_ENV,
    assets_dir,
    bench_dir,
    data_dir,
    database_path,
    demo_dir,
)
