"""packaging/reliability.py --quick (issue 13): engine and app kills that lose nothing, a flat soak, and
every bad input refused specifically, on the demo pair, as CI runs it (this test is how CI runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_loses_nothing_and_refuses_every_bad_input() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "reliability.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.stdout.strip(), run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for part in ("engine_kills", "app_kills"):
        kills = report[part]
        assert kills["injected"] == 3, (part, kills)
        assert kills["survived"] == kills["injected"] and kills["tokens_lost"] == 0, (part, kills["failures"])
    soak = report["soak"]
    assert soak["generations"] == 50 and soak["failures"] == [], soak
    assert abs(soak["rss_end_mb"] - soak["rss_start_mb"]) <= 0.05 * soak["rss_start_mb"]
    inputs = report["bad_inputs"]
    assert inputs["failures"] == [], json.dumps(inputs["failures"], indent=1)
    assert inputs["passed"] == inputs["tried"] >= 60
    assert run.returncode == 0, run.stdout[-3000:]
