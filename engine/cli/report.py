"""`flashdesk doctor --report`: one file to send when something fails on a user's machine.

It holds what a developer without that machine needs: versions, the GPU and its driver (doctor's
environment rows), the kernel self-tests of this card (kernels/self_test.py), the last load (its
memory plan against what it allocated), the step costs measured on this card, and the last errors
the engine reported. Never prompts or replies: the load record and the error log keep counts,
names and messages only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flashdesk import __version__, paths

ERRORS_FILE = "errors.jsonl"  # in the data folder: one JSON object per error the engine reported
LAST_LOAD_FILE = "last_load.json"
KEEP_ERRORS = 50  # the log keeps about the last this many (it is rewritten when twice as long)
MESSAGE_CHARS = 400


def log_error(kind: str, during: str, message: str) -> None:
    """Append an error the engine reported (kind, what it was doing, the first line of its
    message) to the data folder's error log; never raises."""
    try:
        where = paths.data_dir() / ERRORS_FILE
        line = json.dumps(
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "kind": kind,
                "during": during,
                "message": message.splitlines()[0][:MESSAGE_CHARS] if message else "",
            }
        )
        with where.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        lines = where.read_text(encoding="utf-8").splitlines()
        if len(lines) > 2 * KEEP_ERRORS:
            where.write_text("\n".join(lines[-KEEP_ERRORS:]) + "\n", encoding="utf-8")
    except OSError:
        pass


def record_load(facts: dict) -> None:
    """Keep the last load's facts (model folders, device, context, memory planned and allocated)."""
    try:
        (paths.data_dir() / LAST_LOAD_FILE).write_text(
            json.dumps(dict(facts, time=time.strftime("%Y-%m-%dT%H:%M:%S")), indent=1), encoding="utf-8"
        )
    except OSError:
        pass


def _json_file(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _errors() -> list:
    try:
        lines = (paths.data_dir() / ERRORS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-KEEP_ERRORS:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _self_tests() -> dict:
    """This machine's kernel self-tests as the last load or `doctor --kernels` kept them."""
    try:
        import torch

        from flashdesk.kernels import backend, self_test

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if not backend.use_triton(device):
            return {"device": str(device), "note": "the Triton kernels do not run here"}
        kept = self_test.kept_results(device)
        if kept is None:
            return {
                "device": str(device),
                "note": "not run yet for this driver and version: flashdesk doctor --kernels",
            }
        results, pdl = kept
        return {"device": str(device), "pdl": pdl, "kernels": [vars(r) for r in results]}
    except Exception as exc:  # noqa: BLE001 - the report must never fail
        return {"error": f"{type(exc).__name__}: {exc}"}


def build_report() -> dict:
    from flashdesk.engine.cli.doctor import environment_report

    return {
        "flashdesk": __version__,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "environment": [f"{label}: {value}" for label, value in environment_report()],
        "kernel_self_tests": _self_tests(),
        "last_load": _json_file(paths.data_dir() / LAST_LOAD_FILE),
        "step_costs": [
            dict(_json_file(path) or {}, file=path.name)
            for path in sorted((paths.data_dir() / "step_costs").glob("*.json"))
        ],
        "errors": _errors(),
    }


def write_report(where: str | None) -> str:
    """Write the report to `where` ("-": stdout), by default a new file in the data folder; returns
    where it went."""
    text = json.dumps(build_report(), indent=1, default=str)
    if where == "-":
        print(text)
        return "stdout"
    path = (
        Path(where).expanduser()
        if where
        else (paths.data_dir() / "reports" / f"flashdesk-report-{time.strftime('%Y%m%d-%H%M%S')}.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    return str(path)
