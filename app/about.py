"""Help's texts and places: About with the versions a problem report needs, and where the guides are.

Why package metadata for torch and triton: the window never imports torch (the engine runs in its
own process), yet a report needs the versions the engine runs on; importlib.metadata reads what is
installed without importing it.
"""

from __future__ import annotations

import html
import platform
from importlib import metadata
from pathlib import Path

import PySide6
from PySide6.QtCore import QUrl, qVersion

import flashdesk

APP_NAME = "FlashDesk"
NOT_INSTALLED = "not installed"
DOCS_PAGE = Path("docs") / "app.md"  # the window, page by page; in the source tree and the wheel
DOCS_LABELS = ("documentation", "docs", "homepage")  # a Project-URL naming the guides, best first


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def versions() -> list[tuple[str, str]]:
    """(what, version): FlashDesk, Python, Qt and PySide6, and the engine's torch and triton."""
    return [
        (APP_NAME, flashdesk.__version__),
        ("Python", platform.python_version()),
        ("Qt", qVersion()),
        ("PySide6", PySide6.__version__),
        ("torch (engine)", package_version("torch")),
        ("triton (engine)", package_version("triton")),
    ]


def about_text(model: str | None = None) -> str:
    """Help → About: what FlashDesk is, the versions, the loaded model, and where to read more."""
    rows = "".join(f"<tr><td>{what}</td><td>&nbsp;&nbsp;{version}</td></tr>" for what, version in versions())
    rows += f"<tr><td>Model</td><td>&nbsp;&nbsp;{html.escape(model or 'none loaded')}</td></tr>"  # a server's id
    return (
        f"<b>{APP_NAME} {flashdesk.__version__}</b><br><br>A desktop chat with its own inference engine for "
        "Google's Gemma 4 26B-A4B on one NVIDIA card, sped up by speculative decoding (z-lab's DFlash drafter "
        "or Gemma 4's MTP assistant) without changing what the model says.<br><br>"
        f"<table>{rows}</table><br>"
        "Help → Documentation opens the guides (docs/app.md: the window, page by page). "
        "Help → Copy diagnostics puts what to send with a problem report on the clipboard."
    )


def documentation_url() -> QUrl | None:
    """The guides: docs/app.md of the source tree or the installed wheel (both carry docs/), else the
    documentation address the installed package names (a Project-URL), else None."""
    local = Path(flashdesk.__file__).resolve().parent / DOCS_PAGE
    if local.is_file():
        return QUrl.fromLocalFile(str(local))
    try:
        entries = metadata.metadata("flashdesk").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return None
    named = {}
    for entry in entries:
        label, _, url = entry.partition(",")
        named[label.strip().lower()] = url.strip()
    found = next((named[label] for label in DOCS_LABELS if named.get(label)), None)
    return QUrl(found) if found else None
