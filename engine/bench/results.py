"""Bench results kept in the data folder: one file per (device, driver, model, drafter), a list of
runs, newest last; the history of them; and the draft length the kept runs say is best here."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from flashdesk.protocol import AUTO_DRAFT_LENGTH as AUTO

log = logging.getLogger(__name__)

KEPT_RUNS = 100  # runs a results file keeps, newest last


def model_label(folder: str | Path) -> str:
    """A readable name for a model folder: the Hub id of a cached snapshot, `demo-target` for the
    demo pair's generic folder names, else the folder's name."""
    p = Path(folder).expanduser().resolve()
    for part in p.parts:
        if part.startswith("models--") and part.count("--") >= 2:
            return "/".join(part.split("--")[1:])
    if p.name in ("target", "drafter", "draft", "model") and p.parent.name:
        return f"{p.parent.name}-{p.name}"
    return p.name


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")[:60] or "x"


def results_key(device_name: str, driver: str, model: str, drafter: str) -> str:
    return "__".join(_slug(part) for part in (device_name, driver, model, drafter))


def compact(report: dict) -> dict:
    """The report as a results file keeps it: no per-prompt token ids."""
    out = {k: v for k, v in report.items() if k not in ("categories",)}
    out["modes"] = [{k: v for k, v in m.items() if k != "per_prompt"} for m in report["modes"]]
    return out


def save_run(report: dict, folder: Path) -> tuple[Path, int]:
    """Append this run to its results file (newest last, the last KEPT_RUNS); return (file, runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{report['results_key']}.json"
    data = None
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data.get("runs"), list):
                raise ValueError("no list of runs")
        except (ValueError, AttributeError) as exc:
            aside = path.with_suffix(".json.bad")
            os.replace(path, aside)
            log.warning("flashdesk bench: %s was unreadable (%s); kept as %s, starting afresh", path, exc, aside.name)
            data = None
    if data is None:
        data = {
            "device": report["device_name"],
            "driver": report["driver"],
            "model": report["model_name"],
            "drafter": report["draft_name"],
            "runs": [],
        }
    data["runs"] = (data["runs"] + [compact(report)])[-KEPT_RUNS:]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return path, len(data["runs"])


def kept_runs(folder: Path, limit: int) -> list[dict]:
    """The kept runs of every results file, newest first, at most `limit` (unreadable files skipped)."""
    runs = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            runs += [r for r in json.loads(path.read_text(encoding="utf-8"))["runs"] if isinstance(r, dict)]
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return sorted(runs, key=lambda r: str(r.get("date", "")), reverse=True)[:limit]


def history(folder: Path) -> list[dict]:
    """Every results file in `folder`: its key and a line per run."""
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            runs = data["runs"]
        except (ValueError, KeyError, TypeError, OSError):
            continue
        rows = []
        for run in runs:
            modes = run.get("modes", [])
            spec = [m for m in modes if m.get("draft_length") not in (0, None) and m.get("speedup_over_ar")]
            best = max(spec, key=lambda m: m["speedup_over_ar"], default=None)
            rows.append(
                {
                    "date": run.get("date"),
                    "prompts": run.get("prompts"),
                    "tasks": run.get("tasks"),
                    "max_new_tokens": run.get("max_new_tokens"),
                    "ar_tokens_per_second": modes[0].get("tokens_per_second") if modes else None,
                    "best_mode": best and best["mode"],
                    "best_speedup": best and best["speedup_over_ar"],
                }
            )
        out.append(
            {
                "file": str(path),
                "device": data.get("device"),
                "driver": data.get("driver"),
                "model": data.get("model"),
                "drafter": data.get("drafter"),
                "runs": rows,
            }
        )
    return out


def best_draft_length(report: dict) -> int | str | None:
    """The draft length a run says to use with its default method (DFlash in runs before there were
    two), over all its task types: auto where it was at least as fast as the best fixed draft
    length, else that length; None when no mode of that method ran."""
    method = report.get("method") or "dflash"
    spec = [
        m
        for m in report.get("modes", [])
        if m.get("draft_length") not in (0, None)
        and m.get("tokens_per_second")
        and (m.get("method") or "dflash") == method
    ]
    fixed = max((m for m in spec if m["draft_length"] != AUTO), key=lambda m: m["tokens_per_second"], default=None)
    auto = next((m for m in spec if m["draft_length"] == AUTO), None)
    if auto is not None and (fixed is None or auto["tokens_per_second"] >= fixed["tokens_per_second"]):
        return AUTO
    return fixed["draft_length"] if fixed else None


def best_mode(report: dict) -> dict | None:
    """The fastest speculative mode of a run over all its task types, of any method: an automatic one
    where it was at least as fast as the best fixed draft length; {"mode", "method", "draft_length"},
    None when none ran."""
    spec = [m for m in report.get("modes", []) if m.get("draft_length") not in (0, None) and m.get("tokens_per_second")]
    speed = lambda m: m["tokens_per_second"]  # noqa: E731
    fixed = max((m for m in spec if m["draft_length"] != AUTO), key=speed, default=None)
    auto = max((m for m in spec if m["draft_length"] == AUTO), key=speed, default=None)
    pick = auto if auto is not None and (fixed is None or speed(auto) >= speed(fixed)) else fixed
    if pick is None:
        return None
    return {"mode": pick["mode"], "method": pick.get("method") or "dflash", "draft_length": pick["draft_length"]}


def kept_best(folder: Path, key: str) -> tuple[int | str | None, str]:
    """The draft length the newest kept run of `key` says is best on this card, and why in words
    ((None, "") when nothing was benched here yet)."""
    try:
        runs = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))["runs"]
        run = next(r for r in reversed(runs) if best_draft_length(r) is not None)
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None, ""
    best = best_draft_length(run)
    method = run.get("method") or "dflash"  # best_draft_length's: the run's default method
    speed = {
        m["draft_length"]: m["tokens_per_second"]
        for m in run["modes"]
        if m["draft_length"] == 0 or (m.get("method") or "dflash") == method
    }
    ar = speed.get(0)
    gain = f", {speed[best] / ar:.2f}x AR" if ar else ""
    name = "auto" if best == AUTO else f"K={best}"
    return best, f"{name}: fastest in the bench of {str(run.get('date', '?'))[:10]}{gain}"


def benched_default(device, model_dir, draft_dir) -> tuple[int | str | None, str]:
    """kept_best for this pair on this card: what `Engine.load(draft_default=...)` and
    `Engine.use_draft_default` take (the default draft length the newest kept bench found fastest)."""
    from flashdesk import paths
    from flashdesk.engine.bench.device import DeviceProbe

    probe = DeviceProbe(device)
    try:
        key = results_key(probe.name, probe.driver, model_label(model_dir), model_label(draft_dir))
    finally:
        probe.close()
    return kept_best(paths.bench_dir(), key)
