"""The type check: mypy finds nothing in the files pyproject.toml's [tool.mypy] lists, at the
strictness it states there (docs/development.md). The mypy run is in the slow tier (conftest.py):
a cold run takes about a minute."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    """mypy needs the import package's name, and the checkout is the package (`flashdesk` is the
    repository root): it runs from a folder holding a `flashdesk` link to the checkout."""
    (tmp_path / "flashdesk").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH", "MYPY_CACHE_DIR")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "flashdesk/pyproject.toml",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "--no-color-output",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0 and "Success: no issues found" in run.stdout, run.stdout[-8000:] + run.stderr[-2000:]


def test_the_config_checks_what_the_docs_say() -> None:
    """The files mypy checks are the ones docs/development.md names, each of them there."""
    import tomllib

    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert files, "no files to check"
    missing = [entry for entry in files if not (ROOT / entry.removeprefix("flashdesk/")).exists()]
    assert not missing, f"[tool.mypy] files not in the checkout: {missing}"
    docs = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    section = docs.partition("## Type check")[2].partition("\n## ")[0]
    named = set(re.findall(r"`([\w/.]+)`", section))
    assert {entry.removeprefix("flashdesk/").rstrip("/") for entry in files} <= {n.rstrip("/") for n in named}
