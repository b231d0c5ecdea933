"""The project's shape: one import package, layers that keep to themselves, doctor, the window."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def _py(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _import_lines(path: Path) -> list[str]:
    """The import statements of a Python file, one logical line each (comments dropped)."""
    text = path.read_text(encoding="utf-8")
    return [m.group(0) for m in re.finditer(r"^[ \t]*(?:import|from)[ \t]+[^\n]*", text, re.MULTILINE)]


def _py_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


# -- one import package ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["app", "engine", "kernels"])
def test_no_top_level_module(name: str, tmp_path: Path) -> None:
    """Our folders import only as flashdesk's subpackages: from a neutral directory a top-level
    `kernels` is Hugging Face's (which transformers may install), or nothing, never ours."""
    r = _py(
        f"import importlib.util; spec = importlib.util.find_spec({name!r}); print(spec.origin if spec else '')",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    origin = r.stdout.strip()
    assert not origin or Path(origin).resolve().parent != ROOT / name, f"`import {name}` finds ours: {origin}"


def test_subpackages_import_as_flashdesk(tmp_path: Path) -> None:
    r = _py(
        "import flashdesk, flashdesk.app, flashdesk.engine, flashdesk.kernels, pathlib;"
        "print(pathlib.Path(flashdesk.__file__).resolve().parent)",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == ROOT


# -- layers ------------------------------------------------------------------------------------


def test_app_does_not_import_torch(tmp_path: Path) -> None:
    r = _py(
        "import sys, flashdesk.app, flashdesk.app.main;"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'));"
        "print(bad); sys.exit(1 if bad else 0)",
        tmp_path,
        QT_QPA_PLATFORM="offscreen",
    )
    assert r.returncode == 0, f"flashdesk.app pulled in torch: {r.stdout}{r.stderr}"


def test_app_source_has_no_torch_import() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in _py_files("app")
        for line in _import_lines(p)
        if re.search(r"\b(torch|flashdesk\.engine|flashdesk\.kernels)\b|from \.\.(engine|kernels)\b", line)
    ]
    assert not offenders, "the app layer must not import torch or the engine:\n" + "\n".join(offenders)


def test_engine_source_has_no_qt_import() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in _py_files("engine") + _py_files("kernels")
        for line in _import_lines(p)
        if re.search(r"\b(PySide6|PyQt5|PyQt6|shiboken6|pyqtgraph|flashdesk\.app)\b|from \.\.app\b", line)
    ]
    assert not offenders, "engine/ and kernels/ must not import Qt or the app:\n" + "\n".join(offenders)


def test_kernels_do_not_import_engine_or_app() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in _py_files("kernels")
        for line in _import_lines(p)
        if re.search(r"\bflashdesk\.(engine|app)\b|from \.\.(engine|app)\b", line)
    ]
    assert not offenders, "kernels/ imports nothing of engine/ or app/:\n" + "\n".join(offenders)


def test_nothing_cites_documents_outside_the_repository() -> None:
    """Every fact the code leans on is in docs/ (model.md, performance-model.md, architecture.md),
    so someone with only a clone can follow each reference."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    names = ("MODEL" + "-SPEC", "PERFORMANCE" + "-MODEL", "shared" + "/design", r"\.\./" + "shared")
    outside = re.compile("|".join(names))  # spelled in pieces: this file is among those searched
    cited = [
        name
        for name in files
        if (ROOT / name).suffix in (".py", ".md", ".jinja", ".toml", ".sh")
        and outside.search((ROOT / name).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not cited, cited


def test_engine_modules_do_not_load_qt(tmp_path: Path) -> None:
    modules = sorted(
        ".".join(("flashdesk", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        for p in (ROOT / "engine").rglob("*.py")
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'PyQt5', 'PyQt6'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    r = _py(code, tmp_path)
    assert r.returncode == 0, f"importing the engine failed or loaded Qt: {r.stdout}{r.stderr}"


# -- doctor ------------------------------------------------------------------------------------


def test_environment_report_rows() -> None:
    from flashdesk.engine.cli.doctor import environment_report, format_report

    rows = environment_report()
    labels = [label for label, _ in rows]
    for needed in ("Python", "torch", "CUDA", "NVML", "triton", "flash-attn"):
        assert needed in labels, f"no {needed} row in {labels}"
    assert all(isinstance(t, str) and t for _, t in rows)
    text = format_report(rows)
    assert len(text.splitlines()) == len(rows)
    import torch

    assert dict(rows)["torch"] == torch.__version__


def test_environment_report_names_the_prefix_cache_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashdesk.engine.cli.doctor import environment_report

    monkeypatch.setenv("FLASHDESK_PREFIX_CACHE_MB", "1536")
    assert "up to 1.50 GiB of host memory" in dict(environment_report())["prefix cache"]
    monkeypatch.setenv("FLASHDESK_PREFIX_CACHE_MB", "0")
    assert dict(environment_report())["prefix cache"].startswith("off")


def test_environment_report_survives_broken_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing pynvml, a broken triton and a GPU whose memory query fails are text, not errors."""
    import torch

    from flashdesk.engine.cli import doctor

    real_import = doctor._import

    def fake_import(name: str):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        if name == "triton":
            raise RuntimeError("triton is broken")
        if name == "flash_attn":
            raise OSError("libcudart.so.12: cannot open shared object file")
        return real_import(name)

    def no_mem(i: int = 0):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(doctor, "_import", fake_import)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA GeForce RTX 4090")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 9))
    monkeypatch.setattr(torch.cuda, "mem_get_info", no_mem)

    rows = dict(doctor.environment_report())
    assert rows["CUDA"].startswith("available")
    assert "RTX 4090" in rows["GPU 0"] and "out of memory" in rows["GPU 0"]
    assert "pynvml" in rows["NVML"]
    assert "triton is broken" in rows["triton"]
    assert "libcudart" in rows["flash-attn"]

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (20 * 1024**3, 24 * 1024**3))
    rows = dict(doctor.environment_report())
    assert "20.0 GiB free of 24.0 GiB" in rows["GPU 0"]


def test_environment_report_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashdesk.engine.cli import doctor

    real_import = doctor._import

    def fake_import(name: str):
        if name == "torch":
            raise ImportError("libtorch_cpu.so: cannot open shared object file")
        return real_import(name)

    monkeypatch.setattr(doctor, "_import", fake_import)
    rows = dict(doctor.environment_report())
    assert "not importable" in rows["torch"] and "libtorch_cpu" in rows["torch"]
    assert "CUDA" in rows


# -- the window --------------------------------------------------------------------------------


def test_main_window_opens_on_the_setup_page(qtbot) -> None:
    from flashdesk.app.main import create_main_window

    window = create_main_window()
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    assert window.windowTitle() == "FlashDesk"
    assert window.pages.currentIndex() == 0  # first run: the model setup page


def test_run_app_event_loop(tmp_path: Path) -> None:
    """run_app shows the window and returns 0 when the loop quits. In a process of its own: once
    a QApplication's exec() has returned, Qt ends every later event loop at once, which would
    break the Qt tests that run after it in this one."""
    code = (
        "import sys\n"
        "from PySide6.QtCore import QTimer\n"
        "from PySide6.QtWidgets import QApplication\n"
        "from flashdesk.app.main import application, run_app\n"
        "application()  # the timer below needs the application's event dispatcher\n"
        "seen = []\n"
        "def check_and_quit():\n"
        "    seen.extend(w.windowTitle() for w in QApplication.topLevelWidgets() if w.isVisible())\n"
        "    for w in QApplication.topLevelWidgets():\n"
        "        w.close()\n"
        "    QApplication.quit()\n"
        "QTimer.singleShot(200, check_and_quit)\n"
        "code = run_app()\n"
        "print('seen', seen)\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(QT_QPA_PLATFORM="offscreen", FLASHDESK_DATA_DIR=str(tmp_path / "data")),
    )
    assert run.returncode == 0, run.stderr
    assert "'FlashDesk'" in run.stdout


def _launcher() -> list[str]:
    script = Path(sys.executable).parent / "flashdesk"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flashdesk"]


def test_launch_command_starts(tmp_path: Path) -> None:
    """`flashdesk` with no arguments opens the window and keeps running (offscreen here)."""
    proc = subprocess.Popen(
        _launcher(),
        cwd=tmp_path,
        env=_clean_env(QT_QPA_PLATFORM="offscreen"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None, f"flashdesk exited with {proc.returncode}: {proc.communicate()}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the display check is for X11/Wayland")
def test_launch_without_display_explains(tmp_path: Path) -> None:
    env = _clean_env()
    for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        env.pop(k, None)
    r = subprocess.run(_launcher(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "no display" in r.stderr and "flashdesk generate" in r.stderr


def test_every_subpackage_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages by hand (the repository root is the package): a folder with
    an __init__.py missing there would be left out of an installed copy."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"flashdesk"} | {
        "flashdesk." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("app", "engine", "kernels")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found == listed


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing(command: list[str]) -> None:
    """The lint rules and the format pyproject.toml configures hold for every file (ruff is in the
    test extra; `ruff check --fix .` and `ruff format .` mend most findings)."""
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
