"""What a model folder says about itself: its short name and the sampling its makers recommend.

The window, `serve` and the worker all name a loaded model and start from its recommended sampling;
they read both here, from the folder alone."""

from __future__ import annotations

import json
from pathlib import Path


DEMO_NAME = "flashdesk-demo"


def model_name(folder: Path) -> str:
    """A short name: the folder's, `org/name` for a Hugging Face cache snapshot, and the demo's own
    for the demo pair (FOLDER/target beside FOLDER/drafter, engine/hub/demo.py), not "target"."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.removeprefix("models--").replace("--", "/")
    if folder.name == "target" and (folder.parent / "drafter" / "config.json").is_file():
        return DEMO_NAME
    return folder.name


def suppress_tokens(folder: Path, vocab: int) -> tuple[int, ...]:
    """generation_config.json's `suppress_tokens`: ids the model must never emit (transformers
    masks them at every step). A value that is not a list of ids in 0..vocab-1 is refused by name."""
    try:
        data = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    value = data.get("suppress_tokens") if isinstance(data, dict) else None
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in value
    ):
        raise ValueError(
            f"{folder / 'generation_config.json'}: suppress_tokens must be a list of token ids in "
            f"0..{vocab - 1}, got {value!r}"
        )
    return tuple(sorted(set(value)))


def sampling_defaults(folder: Path) -> dict:
    """The model's recommended sampling from generation_config.json (greedy when do_sample is false)."""
    try:
        data = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if data.get("do_sample") is False:
        return {"temperature": 0.0}
    valid = {  # a value out of its range is left out (the engine's own default stands), not refused per request
        "temperature": lambda v: 0 <= v <= 2,
        "top_p": lambda v: 0 < v <= 1,
        "top_k": lambda v: v >= 0 and v == int(v),
    }
    return {
        k: data[k]
        for k, ok in valid.items()
        if isinstance(data.get(k), (int, float)) and not isinstance(data[k], bool) and ok(data[k])
    }
