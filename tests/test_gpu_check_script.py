"""The prepared GPU script runs end to end (on the CPU, small shapes), so a session lent a GPU can
spend its minutes measuring instead of debugging the script."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_smoke(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "packaging" / "gpu_check.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["tiny_correctness"]["ok"] is True
    assert results["tiny_correctness"]["dflash_greedy_equals_ar"] is True
    row = results["full_size"]["float32"]
    assert row["ar_step_ms"] > 0 and row["dflash_k15_step_ms"] > 0
