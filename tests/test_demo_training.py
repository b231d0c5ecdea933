"""packaging/train_demo.py's check that a run reproduced the shipped pair, byte for byte, and the
requests its drafter's data are made from (the training itself takes most of an hour and is not
run here)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packaging"))

from demo_training.replies import open_requests
from train_demo import compare_pairs


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


def test_open_requests_reword_held_out_requests_and_keep_the_question() -> None:
    """The drafter's data includes the held-out requests in other forms; a quoted code block is cut to
    whole lines so that the prompt (cut to its last 200 tokens) still holds the question."""
    code = "\n".join(f"    x{i} = {i}" for i in range(100))
    held = [
        ("Write a Python function to add two numbers.", f"```python\ndef add(a, b):\n{code}\n```"),
        ("What does the Python module json do?", "It encodes and decodes JSON."),
    ]
    made = open_requests(held, 40, random.Random(2))
    assert made == open_requests(held, 40, random.Random(2))  # deterministic
    assert len(made) == 40 and len(set(made)) > 8
    assert all(
        m.startswith(("Write a Python function to add", "What does the Python module json", "In "))
        or "```python\ndef add(a, b):" in m
        for m in made
    )
    quoting = [m for m in made if "```python" in m]
    assert quoting and all(len(m) < 700 and m.endswith("\n```") for m in quoting)
    assert any(m.startswith("In ") and "write a function to add two numbers." in m for m in made)
