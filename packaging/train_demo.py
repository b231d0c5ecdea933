"""Train FlashDesk's demo pair: a tiny Gemma 4 target and a DFlash drafter for it, on the CPU.

What it trains on (all of it may ship with the app):
- FlashDesk's own documentation: README.md and any Markdown under docs/ (Apache-2.0, as the project)
  as committed at DOCS_REVISION (so that edits to them do not change the weights), plus Markdown
  folders given with --docs;
- the Python standard library's source of the interpreter running this script
  (`Path(os.__file__).parent`, without its test suites, codec tables and site-packages), which is
  PSF-licensed (Python Software Foundation License Version 2).
From the same files it also builds chat-formatted examples in the Gemma 4 chat format, so the demo
answers a chat: "Write a Python function to <a docstring's summary>" -> the function's source in a
code block, "What does <module> do?" -> the docstring, "Explain <heading>." -> that section of our docs.

What it does, in order (51 minutes on a 2-core CPU: the target on one thread, the rest on two):
1. a byte-fallback BPE tokenizer of VOCAB tokens trained on the corpus (`tokenizers`), with every
   Gemma 4 special token at its Gemma 4 id ("\\n" at 107 too) and the Gemma 4 chat template, loaded by
   transformers' GemmaTokenizer exactly like the real one;
2. the target: transformers' `Gemma4ForCausalLM` (the independent reference the engine is tested
   against) in the 26B-A4B's architecture at toy size: sliding and full attention layers with their
   different head dims, k_eq_v, proportional partial RoPE, a dense MLP beside a mixture of 8 experts
   (top 2), final softcap; trained as a language model on the corpus and the chat examples;
3. the drafter: z-lab's `DFlashDraftModel` (the `dflash` package) trained with the DFlash recipe
   against the frozen target: the target first writes greedy replies to chat requests (the held-out
   ones, then the same requests in forms it never saw: another language, a bug to find, code to
   explain, test or refactor, extra conditions), to a few it was trained on, and to plain prefixes of
   the corpus (z-lab trains on target-generated text: what the target itself writes is what
   verification accepts, and what it writes to unfamiliar requests is what a drafter meets in use);
   then blocks of BLOCK tokens [anchor, mask x 15] at random anchors in those replies predict the
   target's next 15 tokens from the target's hidden states after TAP_LAYERS of the positions before the
   anchor, many blocks per sequence in one pass (each block sees only its own context), with the
   target's embedding (times sqrt(hidden), as the engine does for Gemma) and its tied head, and the
   loss of block position k weighted by exp(-(k-1)/7).

What it writes (bf16 weights, about 6 MB in all), under --out (default assets/demo_model/):
    target/   config.json, generation_config.json, model.safetensors (Gemma4ForCausalLM names),
              tokenizer.json, tokenizer_config.json, chat_template.jinja
    drafter/  config.json (z-lab's layout), model.safetensors (fc, hidden_norm, layers.N.*, norm)
    training.json  what went in (corpus files, sizes, sha256) and how long each stage took
    PYTHON-LICENSE.txt  the interpreter's LICENSE.txt (the PSF License asks for it with derivatives)
A NOTICE.md already in --out (provenance and licence, written by hand) is kept.

Deterministic: fixed seeds, sorted files, a fixed tokenizer alphabet, fixed thread counts; the same
DOCS_REVISION, Python (whose standard library is the corpus), torch, --target-threads and
--draft-threads give the same weights, byte for byte.

The stages are the modules of packaging/demo_training/ (recipe: every constant; corpus, tokenizer,
target, replies, drafter); this script runs them in order and writes the folder.

    .venv/bin/python packaging/train_demo.py    # into assets/demo_model/ (not the shipped bytes: see its NOTICE.md)
    .venv/bin/python packaging/train_demo.py --quick --out /tmp/demo   # a two-minute smoke run
    .venv/bin/python packaging/train_demo.py --out /tmp/demo/demo_model --compare assets/demo_model
                                                    # did this run give the shipped bytes?

The defaults (seed 2, 1200 target steps on one thread, 6000 drafter steps on two) write the shipped
pair, byte for byte (NOTICE.md has the runs and the figures). The target keeps one thread because its
weights were chosen at that count (a model this small reads better or worse by seed and rounding
alone); the drafter uses the second core (6 steps a second instead of 3.4), which takes the run from
62 to 51 minutes.
--seed changes the target's initial weights and the order of its training windows: a model this small
loops more or less under greedy decoding by seed alone (packaging/demo_quality.py counts it), and the
less its text repeats, the longer its drafter must train to be accepted as often (NOTICE.md has the runs).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path

import torch

from demo_training.corpus import build_corpus
from demo_training.drafter import build_drafter, save_drafter, train_drafter
from demo_training.recipe import DOCS_REVISION, ROOT, STDLIB, VOCAB, log, write_json
from demo_training.replies import greedy_replies, reply_prompts
from demo_training.target import Windows, build_target, load_bf16_target, save_target, train_target
from demo_training.tokenizer import encode, train_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "demo_model")
    parser.add_argument(
        "--docs-revision",
        default=DOCS_REVISION,
        help="git revision to read README.md and docs/ from, or 'worktree' (default: %(default)s)",
    )
    parser.add_argument("--docs", type=Path, action="append", default=[], help="more Markdown folders for the corpus")
    parser.add_argument(
        "--target-threads",
        type=int,
        default=1,
        help="torch threads for the target's training (its weights depend on it)",
    )
    parser.add_argument(
        "--draft-threads",
        type=int,
        default=2,
        help="torch threads for the replies and the drafter's training (its weights depend on it)",
    )
    parser.add_argument(
        "--seed", type=int, default=2, help="the target's initial weights and its order of training windows"
    )
    parser.add_argument("--target-steps", type=int, default=1200)
    parser.add_argument("--draft-steps", type=int, default=6000)
    parser.add_argument("--replies", type=int, default=5000, help="target replies generated for the drafter")
    parser.add_argument("--save-replies", type=Path, help="also keep the drafter's data (token ids) in this file")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few steps of everything")
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="PAIR",
        help="then compare the weights, tokenizer and configs with this pair's (e.g. assets/demo_model) "
        "byte for byte; exit 1 if any differ",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.target_steps, args.draft_steps, args.replies = 30, 30, 48
    torch.set_num_threads(args.target_threads)
    torch.manual_seed(args.seed)
    random.seed(0)
    times, t0 = {}, time.time()
    log(
        f"Python {sys.version.split()[0]} standard library at {STDLIB}; torch {torch.__version__}, "
        f"{args.target_threads} thread(s) for the target, {args.draft_threads} for the drafter"
    )

    work = args.out.with_name(args.out.name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    target_dir, drafter_dir = work / "target", work / "drafter"

    corpus = build_corpus(args.docs_revision, args.docs)
    chars = sum(map(len, corpus["plain"]))
    log(
        f"corpus: {len(corpus['manifest'])} files, {chars / 1e6:.1f} M characters of plain text, "
        f"{len(corpus['chats'])} conversations, {len(corpus['held_out'])} held-out requests"
    )
    tok = train_tokenizer(corpus["plain"] + corpus["chats"], target_dir)
    plain = encode(tok, corpus["plain"], bos=True)
    chats = encode(tok, corpus["chats"], bos=False)  # they begin with their own <bos>
    n_plain, n_chat = sum(map(len, plain)), sum(map(len, chats))
    log(
        f"tokenizer: {VOCAB} tokens; {n_plain / 1e6:.2f} M plain tokens ({chars / n_plain:.2f} characters a token), "
        f"{n_chat / 1e6:.2f} M chat tokens"
    )
    times["corpus_and_tokenizer_s"] = time.time() - t0

    t = time.time()
    target = build_target()
    log(f"target: {sum(p.numel() for p in target.parameters()) / 1e6:.2f} M parameters")
    windows = Windows(plain, chats, chat_share=0.4, length=512, seed=1 + args.seed)
    target_loss = train_target(target, windows, args.target_steps, batch=8)
    save_target(target, target_dir)
    times["target_s"] = time.time() - t

    t = time.time()
    torch.set_num_threads(args.draft_threads)
    target = load_bf16_target(target_dir)  # the drafter learns the target as it ships
    prompts = reply_prompts(tok, corpus, plain, args.replies)
    data = greedy_replies(target, prompts, new_tokens=160, batch=32)
    times["replies_s"] = time.time() - t

    t = time.time()
    drafter = build_drafter(seed=3)
    log(f"drafter: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f} M parameters")
    if args.save_replies:
        torch.save(data, args.save_replies)
    accepted = train_drafter(drafter, target, data, args.draft_steps, batch=8, blocks=16, seed=4)
    save_drafter(drafter, drafter_dir)
    times["drafter_s"] = time.time() - t
    times["total_s"] = time.time() - t0

    write_json(
        work / "training.json",
        {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "target_threads": args.target_threads,
            "draft_threads": args.draft_threads,
            "seed": args.seed,
            "docs_revision": args.docs_revision,
            "quick": args.quick,
            "target_steps": args.target_steps,
            "draft_steps": args.draft_steps,
            "plain_tokens": n_plain,
            "chat_tokens": n_chat,
            "conversations": len(corpus["chats"]),
            "drafter_sequences": len(data),
            "final_target_loss": round(target_loss, 4),
            "final_drafter_accepted_per_block": round(accepted, 3),
            "seconds": {k: round(v, 1) for k, v in times.items()},
            "corpus": [{"kind": k, "file": f, "sha256_16": h, "chars": n} for k, f, h, n in corpus["manifest"]],
        },
    )
    if (STDLIB / "LICENSE.txt").is_file():  # the PSF License asks that its text and notice go with derivatives
        shutil.copyfile(STDLIB / "LICENSE.txt", work / "PYTHON-LICENSE.txt")
    notice = args.out / "NOTICE.md"  # written by hand: kept
    if notice.is_file():
        shutil.copyfile(notice, work / "NOTICE.md")
    if args.out.exists():
        shutil.rmtree(args.out)
    work.rename(args.out)
    log(
        f"wrote {args.out} in {times['total_s'] / 60:.1f} min "
        f"({', '.join(f'{k} {v / 60:.1f} min' for k, v in times.items() if k != 'total_s')})"
    )
    return compare_pairs(args.out, args.compare) if args.compare else 0


def compare_pairs(ours: Path, theirs: Path) -> int:
    """Whether a run reproduced a pair: every file of its target/ and drafter/, byte for byte."""
    names = sorted(
        {
            f.relative_to(d).as_posix()
            for d in (ours, theirs)
            for sub in ("target", "drafter")
            for f in (d / sub).glob("*")
            if f.is_file()
        }
    )
    differ = [
        n
        for n in names
        if not (
            (ours / n).is_file() and (theirs / n).is_file() and (ours / n).read_bytes() == (theirs / n).read_bytes()
        )
    ]
    for name in names:
        log(f"{name}: {'DIFFERS' if name in differ else 'identical'}")
    log(
        f"{'reproduced' if not differ else 'NOT reproduced'}: {len(names) - len(differ)} of {len(names)} files "
        f"identical to {theirs}"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
