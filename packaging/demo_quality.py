"""How a demo pair's greedy text reads: the figures NOTICE.md quotes when choosing what train_demo.py ships.

A model this small often falls into repetition under greedy decoding; how often depends on its seed as
much as on its recipe, so candidates are compared on the same prompts with the same counts:
- loop: the reply's last 80 characters repeat with a period of 1-26 characters, three times or more
  (it never got out);
- stutter: somewhere a unit of 1-3 letters repeats at least four times in a row ("_isisisis");
- prose: the reply has no code block (the chat, summarization and translation sets ask for prose);
- code request: the tests' request (tests/test_demo_pair.py) is answered with a `def` and a `return`.
Replies are greedy, up to 128 new tokens, to the first PER_TASK prompts of each task set in assets/prompts/.

    .venv/bin/python packaging/demo_quality.py assets/demo_model [more pair folders] [--show]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

PER_TASK = 8
CODE_REQUEST = "Write a Python function to return the n-th Fibonacci number."  # as tests/test_demo_pair.py


def loops(text: str) -> bool:
    tail = text[-80:]
    return len(tail) == 80 and any(all(tail[i] == tail[i - p] for i in range(p, 80)) for p in range(1, 27))


def stutters(text: str) -> bool:
    return re.search(r"([A-Za-z_]{1,3})\1{3,}", text) is not None


def judge(folder: Path, show: bool) -> dict:
    from flashdesk.engine.bench.prompts import TASKS, task_prompts
    from flashdesk.engine.decode.chat_format import build_prompt_ids, messages_from
    from flashdesk.engine.decode.generation import Engine, GenerationRequest

    engine = Engine.load(folder / "target", device="cpu")

    def reply(prompt: str, new_tokens: int) -> str:
        ids = build_prompt_ids(engine.tokenizer, messages_from(prompt), enable_thinking=False)
        return list(engine.generate(GenerationRequest(ids, new_tokens)))[-1].text

    counts = {"replies": 0, "loop": 0, "stutter": 0, "prose": 0}
    by_task = {}
    for task in TASKS:
        looped = 0
        for item in task_prompts(task)[:PER_TASK]:
            text = reply(item["prompt"], 128)
            looping = loops(text)
            counts["replies"] += 1
            counts["loop"] += looping
            counts["stutter"] += stutters(text)
            counts["prose"] += "```" not in text
            looped += looping
            if show:
                print(f"  {task:13s} loop={looping!s:5s} {text[:150]!r}")
        by_task[task] = looped
    code = reply(CODE_REQUEST, 120)
    return {
        "pair": str(folder),
        **counts,
        "loops_by_task": by_task,
        "code_request_ok": "def " in code and "return" in code,
        "code_reply": code[:200],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pairs", type=Path, nargs="+", help="folders holding target/ (and drafter/)")
    parser.add_argument("--show", action="store_true", help="print the start of every reply")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [judge(folder, args.show) for folder in args.pairs]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        n = r["replies"]
        print(
            f"{r['pair']}: loop {r['loop']}/{n}, stutter {r['stutter']}/{n}, prose {r['prose']}/{n}, "
            f"code request {'ok' if r['code_request_ok'] else 'FAILS'}\n  {r['code_reply']!r}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
