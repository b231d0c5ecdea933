"""`flashdesk install-desktop`: put FlashDesk in the desktop's application menu.

Writes a freedesktop.org desktop entry (`flashdesk.desktop`, the name the window announces as its
desktop file, so the running window gets its menu entry's icon) and the scalable icon into the
user's data folder (`$XDG_DATA_HOME`, else `~/.local/share`): nothing needs root, and
`--uninstall` takes both away. The entry starts the `flashdesk` launcher of the environment that
runs this command, so the menu opens the same installation the terminal does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from flashdesk.engine.errors import FlashDeskError
from flashdesk.paths import assets_dir

DESKTOP_ID = "flashdesk"  # app/main.py's QApplication.setDesktopFileName
ICON = "flashdesk.svg"


def data_home() -> Path:
    """$XDG_DATA_HOME when it is an absolute path (the spec ignores a relative one), else ~/.local/share."""
    value = os.environ.get("XDG_DATA_HOME", "")
    return Path(value) if value and os.path.isabs(value) else Path.home() / ".local" / "share"


def entry_path(home: Path) -> Path:
    return home / "applications" / f"{DESKTOP_ID}.desktop"


def icon_path(home: Path) -> Path:
    return home / "icons" / "hicolor" / "scalable" / "apps" / f"{DESKTOP_ID}.svg"


def launcher() -> list[str]:
    """The command that opens the window: this environment's `flashdesk` script, or its Python
    running the package when the script is not beside it (a checkout run with `python -m`)."""
    script = Path(sys.executable).parent / "flashdesk"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "flashdesk"]


def _quote(argument: str) -> str:
    """An Exec argument as the Desktop Entry Specification writes it: in double quotes when it holds
    a space or a reserved character, with `"`, `` ` ``, `$` and backslash escaped by a backslash and
    `%` doubled (field codes); then every backslash doubled again, the escape of any string value,
    which the spec applies before the quoting rule."""
    argument = argument.replace("%", "%%")
    if any(c in argument for c in " \t\n\"'\\><~|&;$*?#()`"):
        argument = '"' + "".join("\\" + c if c in '"`$\\' else c for c in argument) + '"'
    return argument.replace("\\", "\\\\")


def desktop_entry(command: list[str]) -> str:
    """The entry's text (Desktop Entry Specification 1.5)."""
    return "\n".join(
        [
            "[Desktop Entry]",
            "Type=Application",
            "Version=1.5",
            "Name=FlashDesk",
            "GenericName=Local AI chat",
            "Comment=Chat with Gemma 4 on your own graphics card, with speculative decoding you can watch",
            "Exec=" + " ".join(_quote(part) for part in command),
            f"Icon={DESKTOP_ID}",
            "Terminal=false",
            "Categories=Utility;Development;",
            "Keywords=LLM;AI;chat;Gemma;GPU;",
            "StartupNotify=true",
            f"StartupWMClass={DESKTOP_ID}",
            "",
        ]
    )


def _write_atomically(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same folder, so no half-written file is ever seen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(data)
    try:
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, path)
    except BaseException:
        os.unlink(tmp.name)
        raise


def install(home: Path | None = None) -> list[Path]:
    """Write the icon, then the entry that names it; returns both paths."""
    home = home or data_home()
    icon, entry = icon_path(home), entry_path(home)
    try:
        _write_atomically(icon, (assets_dir() / ICON).read_bytes())
        _write_atomically(entry, desktop_entry(launcher()).encode())
    except OSError as exc:
        raise FlashDeskError(f"cannot write the desktop entry under {home}: {exc.strerror or exc}") from exc
    return [entry, icon]


def uninstall(home: Path | None = None) -> list[Path]:
    """Remove the entry and the icon; returns the paths that were there."""
    home = home or data_home()
    removed = []
    for path in (entry_path(home), icon_path(home)):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise FlashDeskError(f"cannot remove {path}: {exc.strerror or exc}") from exc
    return removed


def run_install_desktop(args) -> int:
    if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        raise FlashDeskError(
            "install-desktop writes a freedesktop.org menu entry, which Linux and BSD desktops "
            f"read; this system is {sys.platform}"
        )
    if args.uninstall:
        removed = uninstall()
        print(
            "removed " + ", ".join(map(str, removed))
            if removed
            else f"nothing to remove: no FlashDesk entry under {data_home()}"
        )
        return 0
    entry, icon = install()
    print(f"wrote {entry}\nwrote {icon}\nFlashDesk is in the application menu (it starts {' '.join(launcher())}).")
    refresh = shutil.which("update-desktop-database")  # for menus that cache the entries
    if refresh:
        subprocess.run([refresh, "-q", str(entry.parent)], capture_output=True, check=False, timeout=60)
    return 0
