"""`flashdesk generate`, `chat`, `bench`, `serve`, `doctor` and `models`: the engine from the command line, no Qt
involved."""

from __future__ import annotations

import argparse
import json
import sys

from flashdesk import __version__
from flashdesk.engine.errors import FlashDeskError
from flashdesk.engine.cli.cli_args import (
    add_draft_quantize,
    add_generation_flags,
    load_engine,
    positive_int,
    resolve_models,
    sampling_from,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashdesk", description="FlashDesk engine commands. Run without arguments to open the desktop app."
    )
    parser.add_argument("--version", action="version", version=f"flashdesk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("--model", help="folder of the Gemma 4 target checkpoint (required unless --demo)")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="user message, wrapped in the model's chat template")
    source.add_argument("--prompt-ids", help="comma-separated token ids fed to the model as they are")
    add_generation_flags(gen, system_help="system prompt (with --prompt)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with ids, text, steps, stats")

    chat = sub.add_parser("chat", help="chat in the terminal: streamed replies, history, /commands (/help)")
    chat.add_argument("--model", help="folder of the Gemma 4 target checkpoint (required unless --demo)")
    add_generation_flags(chat, system_help="system prompt (/system TEXT changes it)")
    chat.add_argument(
        "--jsonl",
        action="store_true",
        help="for scripts: one JSON request per stdin line, one JSON object per reply or command",
    )
    chat.add_argument(
        "--no-reuse",
        action="store_true",
        help="prefill every turn from scratch instead of reusing the cached conversation",
    )
    chat.add_argument(
        "--context-policy",
        default="drop_oldest",
        choices=["drop_oldest", "stop"],
        help="when the conversation outgrows the context: drop its oldest turns (keeping the "
        "system prompt; the default) or stop with a message",
    )
    chat.add_argument(
        "--tools",
        action="append",
        metavar="FILE",
        help="tools the model may call (repeatable): a .py file (its public functions) or a .json / .toml "
        "file of shell commands; each call is shown and runs only if you answer y",
    )
    chat.add_argument(
        "--tool-choice",
        default="auto",
        metavar="auto|none|required|NAME",
        help="the first round of each message: the model decides (auto), never calls (none), must call "
        "a tool (required) or the tool NAME; later rounds are auto",
    )
    chat.add_argument("--yes", action="store_true", help="run the model's tool calls without asking")

    bench = sub.add_parser(
        "bench",
        help="AR vs DFlash (draft lengths and auto) by task type, side by side; "
        "--synthetic: full-size step timings vs bytes read, random weights, no files",
    )
    bench.add_argument("--model", help="folder of the Gemma 4 target (required unless --demo or --synthetic)")
    bench.add_argument(
        "--draft",
        help="folder of the draft model, a DFlash drafter or an MTP assistant (required unless --demo or --synthetic)",
    )
    bench.add_argument(
        "--assistant", help="Gemma 4's MTP assistant beside a DFlash drafter in --draft: both methods run"
    )
    bench.add_argument(
        "--methods",
        help="comma-separated: dflash, mtp, auto (each step's method and length chosen); default: every "
        "loaded method, and auto when there are two",
    )
    bench.add_argument(
        "--demo",
        action="store_true",
        help="bench the demo pair (a tiny target and drafter, made in the data folder; seconds on the CPU)",
    )
    bench.add_argument(
        "--tasks",
        help="comma-separated task types (default: all: code, math, reasoning, chat, "
        "summarization, translation; with --prompts: the file's)",
    )
    per_task = bench.add_mutually_exclusive_group()
    per_task.add_argument(
        "--prompts-per-task",
        type=int,
        help="prompts of each task type (default: 4 of the built-in sets; all of a --prompts file)",
    )
    per_task.add_argument("--full", action="store_true", help="every prompt of each task type")
    bench.add_argument(
        "--prompts",
        help='your own prompts instead: JSON lines with "prompt" and "task" (or "category"), or one prompt per line',
    )
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument(
        "--draft-lengths",
        default="4,8,15,auto",
        help="each method's modes: draft lengths and 'auto' (the engine picks K each step); AR always runs",
    )
    add_draft_quantize(bench)
    bench.add_argument(
        "--compare",
        action="store_true",
        help="also time transformers' generate and z-lab's reference loop on the same files",
    )
    bench.add_argument("--device", default="auto")
    bench.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    bench.add_argument("--kv-dtype", default="auto", choices=["auto", "bfloat16", "float32", "fp8"])
    bench.add_argument(
        "--chart", help="where to write the PNG chart (default: next to the results, DATA_FOLDER/bench/KEY.png)"
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object (the progress bar stays on stderr)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument(
        "--history",
        action="store_true",
        help="list the earlier runs kept in the data folder (per device, driver, model, drafter)",
    )
    bench.add_argument(
        "--synthetic",
        action="store_true",
        help="time prefill, AR, verify(1..16) and draft steps of the full-size model with random "
        "weights made on the device, against the bytes each step reads",
    )
    bench.add_argument("--layers", type=int, default=30, help="--synthetic: keep the first N decoder layers")
    bench.add_argument(
        "--context",
        type=int,
        help="--synthetic: context fill for ar/verify/draft (default 4096 on a GPU, 256 on the CPU)",
    )
    bench.add_argument(
        "--capacity",
        type=int,
        help="--synthetic: the cache's capacity, as a long context limit allocates it (default: the "
        "context fill + 16); the steps' grids follow it",
    )
    bench.add_argument(
        "--prefill-lengths",
        default="1024,8192",
        help="--synthetic: token counts of the prefill-1024 and prefill-8192 steps (shrink on the CPU)",
    )
    bench.add_argument(
        "--repeats", type=int, help="--synthetic: timed repeats per step (default 5 on a GPU, 1 on the CPU)"
    )
    bench.add_argument(
        "--profile",
        action="store_true",
        help="--synthetic on a GPU: also profile the ar, verify-16 and draft steps' kernels "
        "(count, busy and idle time, the slowest)",
    )

    serve = sub.add_parser(
        "serve",
        help="serve the model to other programs: an OpenAI-compatible API on "
        "http://127.0.0.1:8719/v1 (chat completions, streamed; /metrics)",
    )
    from flashdesk.engine.cli.serve import add_arguments

    add_arguments(serve)

    doc = sub.add_parser("doctor", help="check this machine (and a model folder) for FlashDesk")
    doc.add_argument("--model", help="also check this checkpoint folder")
    doc.add_argument("--draft", help="and this draft model folder, DFlash or MTP (the memory plan includes it)")
    doc.add_argument("--context", type=positive_int, default=32768, help="context for the memory estimate")
    doc.add_argument(
        "--kernels",
        action="store_true",
        help="run every GPU kernel against its torch reference on this device (the load's self-test)",
    )
    doc.add_argument("--json", action="store_true", help="with --kernels: one JSON object")
    doc.add_argument(
        "--report",
        nargs="?",
        const="",
        metavar="FILE",
        help="write one file to send when something fails (versions, GPU and driver, kernel "
        "self-tests, the last load, measured step costs, the last errors; no prompts or replies) "
        "to FILE, '-' for stdout, or by default the data folder",
    )

    models = sub.add_parser(
        "models", help="download, list and check the models (--model / --draft also accept a pulled Hub id)"
    )
    msub = models.add_subparsers(dest="models_command", required=True)
    pull = msub.add_parser("pull", help="download into the Hugging Face cache and check the files")
    pull.add_argument(
        "repo_ids",
        nargs="*",
        metavar="REPO_ID",
        help="default: cyankiwi/gemma-4-26B-A4B-it-AWQ-4bit z-lab/gemma-4-26B-A4B-it-DFlash; optional: "
        "google/gemma-4-26B-A4B-it-assistant (Gemma 4's MTP assistant, a second draft model to compare)",
    )
    pull.add_argument("--force", action="store_true", help="re-download every file")
    pull.add_argument("--yes", action="store_true", help="re-download damaged files without asking")
    check = msub.add_parser(
        "verify",
        help="can FlashDesk run this checkpoint, with which kernels, at which context "
        "on this card? Reads only the configs and safetensors headers (a Hub id: no weights "
        "downloaded)",
    )
    check.add_argument("source", metavar="PATH_OR_REPO", help="a model folder or a Hugging Face id (org/name)")
    check.add_argument(
        "--context", type=positive_int, default=None, help="the context for the memory plan (default 32768)"
    )
    check.add_argument("--json", action="store_true", help="one JSON object")
    listing = msub.add_parser("list", help="the models present, each complete or incomplete (disk only)")
    listing.add_argument("--json", action="store_true")
    msub.add_parser("add", help="list a model folder of your own").add_argument("dir")
    msub.add_parser("remove", help="forget an added model folder").add_argument("dir")

    desktop = sub.add_parser(
        "install-desktop",
        help="put FlashDesk in the desktop's application menu (a freedesktop entry and icon in ~/.local/share)",
    )
    desktop.add_argument("--uninstall", action="store_true", help="remove the entry and the icon")
    return parser


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise ValueError("--prompt-ids is empty")
    return ids


def run_generate(args) -> int:
    from flashdesk.engine.decode.chat_format import build_prompt_ids, messages_from
    from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest

    if args.max_new_tokens < 1:  # as `chat` and `bench` say it, before the model loads
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    sampling = sampling_from(args)  # refuses impossible values
    prompt_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    engine, control = load_engine(args)
    if prompt_ids is None:
        if engine.tokenizer is None:
            raise FlashDeskError(f"{args.model} has no tokenizer, so --prompt cannot be used; give --prompt-ids")
        prompt_ids = build_prompt_ids(
            engine.tokenizer, messages_from(args.prompt, args.system), enable_thinking=args.thinking
        )
    request = GenerationRequest(prompt_ids, args.max_new_tokens, sampling, args.ignore_eos, tuple(args.stop))
    steps, thinking_shown = [], False
    for event in engine.generate(request, control):
        if isinstance(event, FinishEvent):
            break
        if event.index > 0:
            step = {"emitted": event.emitted, "draft": event.draft, "accepted": event.accepted}
            steps.append(step | ({"method": event.method} if event.method else {}))
        if not args.json:
            if event.thought:
                if not thinking_shown:
                    sys.stderr.write("[thinking]\n")
                    thinking_shown = True
                sys.stderr.write(event.thought)
                sys.stderr.flush()
            if event.answer:
                sys.stdout.write(event.answer)
                sys.stdout.flush()
    stats = dict(event.stats)
    if args.json:
        print(
            json.dumps(
                {
                    "prompt_ids": prompt_ids,
                    "token_ids": event.token_ids,
                    "text": event.text,
                    "thought": event.thought,
                    "finish_reason": event.finish_reason,
                    "steps": steps,
                    "stats": stats,
                }
            )
        )
    else:
        sys.stdout.write("\n")
        line = (
            f"[{event.finish_reason}] {len(event.token_ids)} tokens, prefill {stats['prompt_tokens']} "
            f"tokens in {stats['prefill_seconds']:.2f} s, decode {stats['decode_tokens_per_second']:.1f} tok/s"
        )
        if stats["acceptance_rate"] is not None:
            line += (
                f", acceptance {stats['acceptance_rate']:.0%}, mean acceptance length "
                f"{stats['mean_acceptance_length']:.2f}"
            )
        sys.stderr.write(line + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in ("generate", "chat"):
        if args.demo and (args.model or args.draft or getattr(args, "assistant", None)):
            parser.error(f"{args.command}: --demo runs the demo pair; leave out --model and --draft")
        if not args.demo and not args.model:
            parser.error(f"{args.command}: the following arguments are required: --model (or use --demo)")
        if args.demo:
            from flashdesk.engine.hub.demo import demo_pair

            args.model, args.draft = demo_pair()
    if args.command == "bench" and not args.synthetic and not args.history:
        if args.demo and (args.model or args.draft):
            parser.error("bench: --demo benches the demo pair; leave out --model and --draft")
        if not args.demo and not (args.model and args.draft):
            parser.error("bench: the following arguments are required: --model, --draft (or use --demo or --synthetic)")
    try:
        if args.command == "models":
            from flashdesk.engine.hub.models import run_models
            from flashdesk.engine.hub.verify import check_snapshot, print_check, run_verify

            if args.models_command == "verify":
                return run_verify(args)
            return run_models(args, checked=lambda repo_id, snapshot: print_check(check_snapshot(repo_id, snapshot)))
        if args.command == "install-desktop":
            from flashdesk.engine.cli.install_desktop import run_install_desktop

            return run_install_desktop(args)
        if args.command == "serve":  # its address rule comes before the models are looked for
            from flashdesk.engine.cli.serve import run_serve

            return run_serve(args)
        resolve_models(args)
        if args.command == "generate":
            return run_generate(args)
        if args.command == "chat":
            from flashdesk.engine.cli.chat import run_chat

            return run_chat(args)
        if args.command == "bench" and args.synthetic:
            from flashdesk.engine.cli.bench_synthetic import run_synthetic_bench

            return run_synthetic_bench(args)
        if args.command == "bench":
            from flashdesk.engine.cli.bench import run_bench

            return run_bench(args)
        if args.report is not None:
            from flashdesk.engine.cli.report import write_report

            where = write_report(args.report or None)
            if where != "stdout":
                print(f"wrote {where}: send it with your question (it holds no prompts or replies)")
            return 0
        if args.kernels:
            from flashdesk.engine.cli.doctor import run_kernel_checks

            return run_kernel_checks(args.json)
        if args.json:
            raise ValueError("--json goes with --kernels")
        from flashdesk.engine.cli.doctor import run_doctor

        return run_doctor(args.model, args.context, args.draft)
    except (FlashDeskError, ValueError) as exc:
        print(f"flashdesk {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nflashdesk {args.command}: interrupted", file=sys.stderr)
        return 130
