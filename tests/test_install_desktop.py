"""`flashdesk install-desktop`: a freedesktop.org entry and icon in the user's data folder, read back
as a desktop reads them (the Desktop Entry Specification's escapes and quoting), removed by
`--uninstall`, and a clear error where the folder cannot be written."""

import configparser
import os
import sys
from pathlib import Path

import pytest

from flashdesk.__main__ import main
from flashdesk.engine.cli import install_desktop as desk

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="freedesktop entries: Linux")


def exec_arguments(value: str) -> list[str]:
    """The Exec value's arguments as a desktop environment reads them: the string escapes first
    (\\s \\n \\t \\r \\\\), then the quoting rule (a backslash in quotes escapes the next character)."""
    escapes = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    text, i = "", 0
    while i < len(value):
        if value[i] == "\\":
            text += escapes[value[i + 1]]
            i += 2
        else:
            text += value[i]
            i += 1
    arguments, current, quoted, i = [], None, False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\":
            current += text[i + 1]
            i += 1
        elif c == '"':
            quoted, current = not quoted, current or ""
        elif c == " " and not quoted:
            if current is not None:
                arguments.append(current)
            current = None
        else:
            current = (current or "") + c
        i += 1
    assert not quoted, value
    if current is not None:
        arguments.append(current)
    return [argument.replace("%%", "%") for argument in arguments]


def read_entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text())
    return parser["Desktop Entry"]


def test_install_writes_an_entry_and_icon_that_uninstall_removes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    entry, icon = desk.entry_path(tmp_path), desk.icon_path(tmp_path)
    for _ in range(2):  # a second install rewrites the same two files
        assert main(["install-desktop"]) == 0
        assert f"wrote {entry}" in capsys.readouterr().out
    assert icon.read_bytes() == (ROOT / "assets" / "flashdesk.svg").read_bytes()
    fields = read_entry(entry)
    assert (fields["Type"], fields["Name"], fields["Icon"], fields["Terminal"]) == (
        "Application",
        "FlashDesk",
        desk.DESKTOP_ID,
        "false",
    )
    command = exec_arguments(fields["Exec"])
    assert command == desk.launcher() and os.access(command[0], os.X_OK)
    # the window announces the same desktop file name, so it gets the entry's icon
    assert f'setDesktopFileName("{desk.DESKTOP_ID}")' in (ROOT / "app" / "main.py").read_text()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["flashdesk.desktop", "flashdesk.svg"]

    assert main(["install-desktop", "--uninstall"]) == 0
    assert not entry.exists() and not icon.exists()
    assert main(["install-desktop", "--uninstall"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argument",
    ["/opt/flash desk/bin/flashdesk", '/x/"quoted"', "/x/$HOME/`id`", "/x/50%", "/x/back\\slash", "/plain/path"],
)
def test_exec_arguments_survive_the_specifications_quoting(argument):
    value = desk.desktop_entry([argument, "-m", "flashdesk"]).split("Exec=")[1].splitlines()[0]
    assert exec_arguments(value) == [argument, "-m", "flashdesk"]


def test_a_folder_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocked))
    assert main(["install-desktop"]) == 2
    assert f"cannot write the desktop entry under {blocked}" in capsys.readouterr().err
    assert blocked.read_text() == "not a folder"


def test_a_relative_xdg_data_home_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", "relative/share")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert desk.data_home() == tmp_path / ".local" / "share"
