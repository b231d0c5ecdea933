"""The prompt sets by task type (assets/prompts/, written by us) and the bench's choices: which task
types, how many prompts of each, which methods and draft lengths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flashdesk import paths
from flashdesk.engine.errors import FlashDeskError
from flashdesk.protocol import AUTO_DRAFT_LENGTH as AUTO
from flashdesk.protocol import METHOD_NAMES

# "json": replies held to a JSON schema (each prompt's "schema"), where the bench shows the grammar's cost
TASKS = ("code", "math", "reasoning", "chat", "summarization", "translation", "json")
PROMPTS_DIR = paths.assets_dir() / "prompts"  # one JSON-lines file per task type, {"task", "prompt"[, "schema"]}
DEFAULT_PROMPTS_PER_TASK = 4  # keeps a run short (a CPU demo run: seconds); --full takes them all
AUTO_MODE = "DFlash auto"
AUTO_METHOD_MODE = "auto method"  # each step the method and draft length expected fastest
METHODS = ("dflash", "mtp", AUTO)


def _read_jsonl(path: Path, default_task: str) -> list[dict]:
    """JSON lines with "prompt" (and "task" or "category", and a JSON "schema" the reply is held to),
    or plain text, one prompt per line."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
                task = item.get("task") or item.get("category") or default_task
                prompt: dict[str, Any] = {"prompt": str(item["prompt"]), "task": str(task)}
                if item.get("schema") is not None:
                    if not isinstance(item["schema"], dict):
                        raise ValueError("its schema is not a JSON object")
                    prompt["schema"] = item["schema"]
                prompts.append(prompt)
            except (ValueError, KeyError, AttributeError) as exc:
                raise FlashDeskError(f'{path}:{number}: not a JSON object with a "prompt": {exc}') from exc
        else:
            prompts.append({"prompt": line, "task": default_task})
    return prompts


def load_prompts(path: str | Path) -> list[dict]:
    """A prompts file of your own: items {"prompt", "task"} ("category" is read as the task; "other"
    when neither is given)."""
    path = Path(path)
    if not path.is_file():
        raise FlashDeskError(f"prompts file not found: {path}")
    prompts = _read_jsonl(path, "other")
    if not prompts:
        raise FlashDeskError(f"{path} holds no prompts")
    return prompts


def task_prompts(task: str, folder: Path = PROMPTS_DIR) -> list[dict]:
    """The built-in prompts of one task type, in file order."""
    path = folder / f"{task}.jsonl"
    if not path.is_file():
        raise FlashDeskError(f"the built-in prompts of task type {task!r} are missing: {path}")
    return [dict(p, task=task) for p in _read_jsonl(path, task)]


def parse_tasks(text: str | None, known: list[str]) -> list[str]:
    """--tasks: a comma-separated subset of `known` (default: all of them), in the order given."""
    if text is None:
        return list(known)
    tasks = []
    for name in (part.strip().lower() for part in text.split(",")):
        if not name:
            continue
        if name not in known:
            raise ValueError(f"--tasks: unknown task type {name!r}; choose from {', '.join(known)}")
        if name not in tasks:
            tasks.append(name)
    if not tasks:
        raise ValueError(f"--tasks is empty; choose from {', '.join(known)}")
    return tasks


def select_prompts(items: list[dict], tasks: list[str], per_task: int | None) -> list[dict]:
    """The first `per_task` prompts of each task type (all when None), taken round-robin across the
    task types (code 1, math 1, ..., code 2, ...), so a run interrupted or drifting half-way still
    covers every type alike."""
    by_task = {t: [p for p in items if p["task"] == t][:per_task] for t in tasks}
    out = []
    for i in range(max((len(v) for v in by_task.values()), default=0)):
        out += [by_task[t][i] for t in tasks if i < len(by_task[t])]
    return out


def parse_draft_lengths(text: str) -> list[int | str]:
    """--draft-lengths: whole numbers and `auto`, comma-separated (duplicates dropped)."""
    lengths: list[int | str] = []
    for part in (p.strip().lower() for p in str(text).split(",")):
        if not part:
            continue
        if part == AUTO:
            value: int | str = AUTO
        else:
            try:
                value = int(part)
            except ValueError:
                raise ValueError(
                    f"--draft-lengths: {part!r} is not a draft length; give whole numbers "
                    f"(1..the drafter's block size - 1) or {AUTO}, comma-separated"
                ) from None
        if value not in lengths:
            lengths.append(value)
    if not lengths:
        raise ValueError(f"--draft-lengths is empty; give draft lengths such as 4,8,15,{AUTO}")
    return lengths


def mode_name(draft_length: int | str, method: str = "dflash") -> str:
    """AR, "DFlash K=8", "MTP auto", or the automatic method's mode."""
    if draft_length == 0:
        return "AR"
    if method == AUTO:
        return AUTO_METHOD_MODE
    name = METHOD_NAMES.get(method, method)
    return f"{name} auto" if draft_length == AUTO else f"{name} K={draft_length}"


def parse_methods(text: str | None, loaded: list[str]) -> list[str]:
    """--methods: dflash, mtp and auto, comma-separated (default: every loaded method, and auto with two)."""
    if not text:
        return list(loaded) + ([AUTO] if len(loaded) > 1 else [])
    methods = list(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
        if method != AUTO and method not in loaded:
            raise ValueError(
                f"--methods: {method} needs its draft model loaded (loaded: {', '.join(loaded) or 'none'})"
            )
    if not methods:
        raise ValueError("--methods is empty")
    return methods
