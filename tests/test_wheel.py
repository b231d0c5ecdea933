"""The wheel: built from the checkout, installed on its own (no checkout on the path), it has
every module and asset the commands need. Dependencies come from this virtualenv (--no-deps), so
the test needs no network; a fresh virtualenv with its dependencies was checked by hand (CHANGELOG)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_the_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ]
    )
    [wheel] = (tmp_path / "dist").glob("flashdesk-*.whl")
    run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"), str(wheel)])
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), FLASHDESK_DATA_DIR=str(tmp_path / "data"))
    env.pop("FLASHDESK_KERNELS", None)
    where = run([sys.executable, "-c", "import flashdesk; print(flashdesk.__file__)"], env=env, cwd=tmp_path)
    assert where.strip().startswith(str(tmp_path / "site")), where  # the wheel's copy, not the checkout's
    assert (tmp_path / "site" / "flashdesk" / "docs" / "app.md").is_file()  # Help → Documentation, installed
    assert run([sys.executable, "-m", "flashdesk", "--version"], env=env, cwd=tmp_path).startswith("flashdesk ")
    out = run(
        [
            sys.executable,
            "-m",
            "flashdesk",
            "generate",
            "--demo",
            "--prompt",
            "def fib(n):",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
            "--json",
        ],
        env=env,
        cwd=tmp_path,
    )
    assert '"token_ids"' in out
