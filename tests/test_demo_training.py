"""packaging/train_demo.py's check that a run reproduced the shipped pair, byte for byte (the training
itself takes most of an hour and is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packaging"))

from train_demo import compare_pairs  # noqa: E402


@pytest.mark.parametrize("change", ["none", "weights", "missing"])
def test_compare_pairs_says_whether_a_run_reproduced_the_pair(tmp_path, change) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for pair in (ours, theirs):
        for sub in ("target", "drafter"):
            (pair / sub).mkdir(parents=True)
            (pair / sub / "model.safetensors").write_bytes(b"weights of " + sub.encode())
            (pair / sub / "config.json").write_text("{}")
    if change == "weights":
        (theirs / "drafter" / "model.safetensors").write_bytes(b"other weights")
    if change == "missing":
        (theirs / "target" / "config.json").unlink()
    assert compare_pairs(ours, theirs) == (0 if change == "none" else 1)
