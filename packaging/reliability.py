"""Reliability as figures: crashes injected, a soak, and a catalogue of bad input, with nothing lost.

    .venv/bin/python packaging/reliability.py [--quick] [--json] [--seed N]

On the demo pair, on the CPU, in a throwaway folder:
  1. engine kills: the worker SIGKILLed at a random point of a reply, through the app's own
     controller, session and store (reliability_checks/kills.py);
  2. app kills: the app side, a child process, SIGKILLed mid-reply, and its database opened as the
     next start opens it (reliability_checks/kills.py, reliability_checks/child.py);
  3. a soak: many short generations in one engine process, speculation and draft length changed
     between them, watching its memory, open files and threads (reliability_checks/soak.py);
  4. the bad-input catalogue: checkpoints, configs, drafters, quantization, prompts, protocol lines,
     databases, a full disk, and `flashdesk serve`'s requests (reliability_checks/inputs.py and beside it).
It prints the figures; --json ends the output with one JSON object: engine_kills and app_kills
(injected, survived, tokens_lost), soak (generations, rss_start_mb, rss_end_mb), bad_inputs (tried,
passed, failures). The exit code is 1 when anything failed. --quick (CI) runs a few kills, 50
generations and the whole catalogue; the full run 100 engine kills, 20 app kills, 1000 generations.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

FULL = {"engine_kills": 100, "app_kills": 20, "generations": 1000}
QUICK = {"engine_kills": 3, "app_kills": 3, "generations": 50}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reliability.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few kills, 50 generations, every bad input (CI)")
    parser.add_argument("--json", action="store_true", help="end the output with the figures as one JSON object")
    parser.add_argument("--seed", type=int, default=13, help="of the kill points and the soak's prompts")
    for name in FULL:
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, help=f"instead of {FULL[name]} ({QUICK[name]} with --quick)"
        )
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    from flashdesk.engine.hub.demo import create_demo
    from reliability_checks.inputs import Lab, engine_cases, run_catalogue
    from reliability_checks.kills import app_kills, engine_kills
    from reliability_checks.serve_inputs import serve_available, serve_cases
    from reliability_checks.soak import soak
    from reliability_checks.store_inputs import can_mount, store_cases

    counts = {
        name: getattr(args, name) if getattr(args, name) is not None else (QUICK if args.quick else FULL)[name]
        for name in FULL
    }
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="flashdesk-reliability-") as tmp:
        folder = Path(tmp)
        os.environ["FLASHDESK_DATA_DIR"] = str(folder / "data")  # the workers' bench runs and caches: not the user's
        demo = create_demo(folder / "demo")
        seconds = {}
        started = time.monotonic()
        engine = engine_kills(demo, folder, counts["engine_kills"], rng, log)
        seconds["engine_kills"] = time.monotonic() - started
        started = time.monotonic()
        app = app_kills(demo, folder, counts["app_kills"], rng, log)
        seconds["app_kills"] = time.monotonic() - started
        started = time.monotonic()
        soaked = soak(demo, counts["generations"], rng, log)
        seconds["soak"] = time.monotonic() - started
        started = time.monotonic()
        lab = Lab(demo, folder / "inputs")
        try:
            cases = engine_cases(lab) + store_cases(folder / "databases", demo, can_mount())
            if serve_available():
                cases += serve_cases(lab)
            else:
                log("flashdesk.engine.serve is not there: its malformed requests are not tried")
            inputs = run_catalogue(cases, lab, log)
        finally:
            lab.close()
        seconds["bad_inputs"] = time.monotonic() - started
    return {
        "engine_kills": engine.as_dict(),
        "app_kills": app.as_dict(),
        "soak": soaked.as_dict(),
        "bad_inputs": inputs.as_dict(),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "seed": args.seed,
    }


def failed(report: dict) -> bool:
    kills = [report[k] for k in ("engine_kills", "app_kills")]
    return (
        any(k["survived"] != k["injected"] or k["tokens_lost"] or k["failures"] for k in kills)
        or bool(report["soak"]["failures"])
        or bool(report["bad_inputs"]["failures"])
    )


def describe(report: dict) -> list[str]:
    """The figures in words."""
    lines = []
    for key, what in (("engine_kills", "engine killed mid-reply"), ("app_kills", "app killed mid-reply")):
        k = report[key]
        lines.append(
            f"{what}: {k['injected']} injected, {k['survived']} survived, {k['tokens_lost']} tokens lost"
            f" ({report['seconds'][key]:.0f} s)"
        )
        lines += [f"  FAILED {failure}" for failure in k["failures"]]
    s = report["soak"]
    lines.append(
        f"soak: {s['generations']} generations, RSS {s['rss_start_mb']:.1f} MB -> {s['rss_end_mb']:.1f} MB, "
        f"open files {s['open_files_start']} -> {s['open_files_end']}, threads {s['threads_start']} -> "
        f"{s['threads_end']} ({report['seconds']['soak']:.0f} s)"
    )
    lines += [f"  FAILED {failure}" for failure in s["failures"]]
    b = report["bad_inputs"]
    lines.append(f"bad inputs: {b['tried']} tried, {b['passed']} passed ({report['seconds']['bad_inputs']:.0f} s)")
    lines += [f"  FAILED {f['case']}: expected {f['expected']}; {f['happened']}" for f in b["failures"]]
    lines += [f"  skipped {s['case']}: {s['reason']}" for s in b["skipped"]]
    lines.append("nothing failed" if not failed(report) else "SOMETHING FAILED (see above)")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child-app"]:
        from reliability_checks.child import main as child_app

        return child_app(argv[1:])
    args = parse(argv)
    report = run(args)
    print("\n".join(describe(report)), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
