"""The command line's shared flags and checks: `generate`, `chat`, `bench` and `serve` take the same
model, speculation and sampling flags, refuse the same impossible values before anything loads,
and load the engine the same way."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flashdesk.engine.errors import FlashDeskError

if TYPE_CHECKING:
    from flashdesk.engine.decode.sampling import SamplingParams


def add_generation_flags(parser: argparse.ArgumentParser, system_help: str) -> None:
    """The flags `generate` and `chat` share: prompt shaping, sampling, device, KV, speculation."""
    parser.add_argument(
        "--demo",
        action="store_true",
        help="the demo pair instead of --model and --draft (a tiny target and drafter, made in "
        "the data folder; seconds on the CPU)",
    )
    parser.add_argument("--system", help=system_help)
    parser.add_argument("--thinking", action="store_true", help="let the model think before answering")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens tokens")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 turns top-k off")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below this share of the top one's")
    parser.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="above 1: tokens already used are less likely"
    )
    parser.add_argument("--presence-penalty", type=float, default=0.0, help="-2 to 2, on the reply's tokens")
    parser.add_argument("--frequency-penalty", type=float, default=0.0, help="-2 to 2, per use in the reply")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--kv-dtype", default="auto", choices=["auto", "bfloat16", "float32", "fp8"])
    parser.add_argument("--context", type=positive_int, help="context limit in tokens (default: the model's)")
    parser.add_argument("--quantize", choices=["int4"], help="quantize a bf16 checkpoint to int4 while loading")
    add_speculation_flags(parser)


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    """The sampling the shared flags ask for (a ValueError naming an impossible value)."""
    from flashdesk.engine.decode.sampling import SamplingParams

    return SamplingParams(
        args.temperature,
        args.top_p,
        args.top_k,
        args.seed,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
    )


def add_speculation_flags(parser: argparse.ArgumentParser) -> None:
    """The draft models and how they draft: `generate`, `chat` and `serve`."""
    parser.add_argument(
        "--draft",
        help="folder (or pulled Hub id) of a draft model for speculative decoding: a DFlash drafter or "
        "Gemma 4's MTP assistant (told apart by its config)",
    )
    parser.add_argument(
        "--assistant",
        help="folder (or pulled Hub id) of Gemma 4's MTP assistant, beside a DFlash drafter in --draft: "
        "both load, and --method picks (the app can switch between them)",
    )
    parser.add_argument(
        "--method",
        choices=["dflash", "mtp", "auto"],
        help="which draft model drafts when both are loaded; auto: each step the method and length with "
        "the most expected tokens per second on this card (default: the DFlash drafter where one is loaded)",
    )
    parser.add_argument(
        "--draft-length",
        type=draft_length_arg,
        help="tokens drafted per step, 1..the draft model's longest (DFlash: block_size - 1; MTP: 15), or "
        "auto: each step drafts what gives the most tokens per second on this card (default: what your "
        "last `flashdesk bench` of this pair on this card found fastest, else DFlash's whole block or 4 MTP steps)",
    )
    parser.add_argument("--no-speculate", action="store_true", help="load --draft but decode without it")
    add_draft_quantize(parser)


def add_draft_quantize(parser) -> None:
    parser.add_argument(
        "--draft-quantize",
        choices=["auto", "int4", "none"],
        default="auto",
        help="the drafter's weights: int4 weights and an int4 copy of the head, or the "
        "checkpoint's bf16 (none); auto: int4 on a GPU, none on the CPU. Output is unchanged",
    )


def load_engine(args):
    """Check the speculation flags, load the engine; return it with its SpecControl (None without --draft)."""
    from flashdesk.engine.bench.results import benched_default
    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.decode.speculative import SpecControl

    assistant, method = getattr(args, "assistant", None), getattr(args, "method", None)
    if (args.draft_length is not None or args.no_speculate or method) and not args.draft:
        raise ValueError("--draft-length, --method and --no-speculate need --draft")
    if args.draft_quantize not in (None, "auto") and not args.draft:
        raise ValueError("--draft-quantize needs --draft")
    if assistant and not args.draft:
        raise ValueError("--assistant goes beside a DFlash drafter in --draft (an assistant alone: --draft ASSISTANT)")
    engine = Engine.load(
        args.model,
        args.device,
        args.dtype,
        args.kv_dtype,
        args.context,
        args.draft,
        args.quantize,
        draft_quantize=args.draft_quantize,
        draft_default=benched_default,
        assistant_dir=assistant,
    )
    if method == "auto" and len(engine.methods) < 2:
        raise ValueError("--method auto chooses between two draft models: give a DFlash drafter and --assistant")
    if method not in (None, "auto"):
        engine.use_method(method)  # refuses a method whose draft model is not loaded
    if engine.fallback_note():
        print(f"flashdesk: {engine.fallback_note()}", file=sys.stderr, flush=True)
    control = None
    if engine.method is not None:
        longest = engine.max_draft_length
        if args.draft_length not in (None, "auto") and args.draft_length > longest:
            raise ValueError(f"--draft-length must be 1..{longest} for this draft model, got {args.draft_length}")
        control = SpecControl(enabled=not args.no_speculate, draft_length=args.draft_length, method=method)
    return engine, control


def resolve_models(args) -> None:
    """--model / --draft as folders (a pulled Hub id becomes its cached folder; disk only)."""
    for attr, what in (("model", "model"), ("draft", "draft model"), ("assistant", "assistant")):
        if getattr(args, attr, None):
            try:
                setattr(args, attr, str(model_folder(getattr(args, attr), what)))
            except FlashDeskError as exc:
                if args.command != "doctor":
                    raise
                print(f"flashdesk doctor: {exc}", file=sys.stderr)  # doctor still prints its report


def model_folder(name: str, what: str) -> Path:
    """The folder `name` stands for. A missing folder or a file is named here: the loader would
    only say that config.json inside it is missing, which hides the real mistake."""
    from flashdesk.engine.hub.models import resolve_model_path

    path = resolve_model_path(name)  # a Hub id not in the cache raises with its own advice
    if path.is_dir():
        return path
    if path.exists():
        raise FlashDeskError(
            f"{what} path is a file, not a folder: {path.absolute()} (give the folder "
            "holding config.json and the weights)"
        )
    raise FlashDeskError(
        f"{what} folder not found: {path.absolute()} (give a folder holding config.json and "
        "the weights, or a Hub id such as org/name that `flashdesk models pull` downloaded)"
    )


def positive_int(text: str, alternative: str = "") -> int:
    """argparse type for counts that cannot be below 1 (--context): refused before anything loads;
    `alternative` names the word also accepted (for the message)."""
    other = f" (or {alternative})" if alternative else ""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number{other}: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1{other}, got {value}")
    return value


def draft_length_arg(text: str) -> int | str:
    """argparse type for --draft-length: auto or at least 1 (the drafter's own maximum is checked
    once it is loaded, in `load_engine`)."""
    if text.strip().lower() == "auto":
        return "auto"
    return positive_int(text, "auto")
