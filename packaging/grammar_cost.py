"""What a grammar's token mask costs at Gemma 4's vocabulary (docs/serving.md, "Structured output").

The share of a real decode step is `flashdesk bench`'s (its json task type). This times the pieces at
Gemma 4's vocabulary size, 262,144 tokens, with a synthetic tokenizer of that size (random word pieces;
llguidance's cost follows the vocabulary's size and the grammar's state): one mask computed and applied
on the CPU, and a sampled step's grammar work for K drafts (K + 1 masks computed and applied, K drafts
consumed, a rollback), JSON with free strings and with bounded ones.

    python packaging/grammar_cost.py [--drafts 15]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT.parent) not in sys.path:
    sys.path.insert(0, str(ROOT.parent))

from flashdesk.engine.decode.grammar import GrammarState, json_grammar, vocabulary  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}},
        "city": {"enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "tags", "city"],
    "additionalProperties": False,
}
BOUNDED = {**SCHEMA, "properties": {**SCHEMA["properties"], "name": {"type": "string", "maxLength": 40}}}
DOCUMENT = {"name": "Ada Lovelace of the analytical engine", "age": 36, "tags": ["math", "poetry"], "city": "London"}


def synthetic_tokenizer(folder: Path, size: int = 262_144, seed: int = 0):
    """A Gemma-shaped tokenizer (byte fallback, "▁" for spaces, Gemma 4's control tokens at their ids)
    of `size` tokens, most of them random word pieces: only its size and kind matter here."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    specials = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 48: "<|tool_call>", 49: "<tool_call|>"}
    specials |= {50: "<|tool_response>", 52: '<|"|>', 100: "<|channel>", 101: "<channel|>", 106: "<turn|>"}
    words = {f"<0x{b:02X}>" for b in range(256)} | {"▁", "\n"} | {chr(c) for c in range(33, 127)}
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    while len(words) < size - len(specials):
        piece = "".join(rng.choices(letters, k=rng.choice((1, 2, 3, 3, 4, 4, 5, 6, 7, 8, 10))))
        kind = rng.random()
        piece = "▁" + piece if kind < 0.45 else piece.capitalize() if kind < 0.5 else piece
        words.add(piece if kind < 0.95 else str(rng.randrange(10_000)))
    ids = (i for i in range(size) if i not in specials)
    vocab = {text: i for i, text in specials.items()} | {w: next(ids) for w in sorted(words, key=lambda w: (len(w), w))}
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(specials.items())])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", bos_token="<bos>")


def full_vocabulary(drafts: int) -> dict:
    vocab_size = 262_144
    tokenizer = synthetic_tokenizer(Path(tempfile.mkdtemp()), vocab_size)
    t0 = time.perf_counter()
    vocab = vocabulary(tokenizer, vocab_size, 106)
    made = time.perf_counter() - t0
    logits = torch.randn(drafts + 1, vocab_size)
    out = {"vocabulary": vocab_size, "tokenizer_seconds": made}
    for label, schema in (("free strings", SCHEMA), ("maxLength 40", BOUNDED)):
        ids = tokenizer(json.dumps(DOCUMENT), add_special_tokens=False)["input_ids"]
        state = GrammarState(vocab, json_grammar(schema), torch.device("cpu"))
        masks, applies = [], []
        for token in ids:
            t0 = time.perf_counter()
            bits = state.bitmask()
            t1 = time.perf_counter()
            state.apply(logits[:1], bits.unsqueeze(0))
            t2 = time.perf_counter()
            masks.append(t1 - t0)
            applies.append(t2 - t1)
            assert state.consume(token), token
        # a step's work: walk K drafts from each position of the document, mask the K + 1 rows, roll back
        state = GrammarState(vocab, json_grammar(schema), torch.device("cpu"))
        steps = []
        for at in range(0, len(ids) - drafts, 7):
            walk = state.walk()
            t0 = time.perf_counter()
            for token in ids[at : at + drafts]:
                walk.masked(logits[:1])
                walk.take(token)
            walk.target(logits)
            state.settle(walk, drafts // 2, ids[at + drafts // 2])
            steps.append(time.perf_counter() - t0)
            for token in ids[at + drafts // 2 + 1 : at + 7]:
                state.consume(token)
        out[label] = {
            "mask_us_median": 1e6 * statistics.median(masks),
            "mask_us_mean": 1e6 * statistics.fmean(masks),
            "mask_us_max": 1e6 * max(masks),
            "apply_us_mean": 1e6 * statistics.fmean(applies),
            f"step_ms_mean_k{drafts}": 1e3 * statistics.fmean(steps),
            f"step_ms_max_k{drafts}": 1e3 * max(steps),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"gemma4_vocabulary": full_vocabulary(args.drafts)}, indent=2))


if __name__ == "__main__":
    main()
