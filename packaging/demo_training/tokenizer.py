"""Stage 2, the tokenizer: a byte-fallback BPE with Gemma 4's special ids and chat template, loaded by
transformers' GemmaTokenizer exactly as the real one is."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from .recipe import BOS, CHAT_TEMPLATE, NEWLINE_ID, SPECIAL_TOKENS, VOCAB


def train_tokenizer(texts: list[str], folder: Path, vocab_size: int = VOCAB):
    """A SentencePiece-style BPE with byte fallback, "▁" for spaces and Gemma 4's special ids.

    The merges are learnt over pieces (a newline; a run of spaces with the word after it) so that
    indentation and words become tokens; the tokenizer itself has no pre-tokenizer, as Gemma's."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.normalizer = normalizers.Replace(" ", "▁")
    learner.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n|▁*[^▁\n]+|▁+"), behavior="isolated")
    specials = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS.values()))
    texts = [specials.sub("\n", t) for t in texts]
    # the 160 most frequent characters, ties by code point (the trainer's own cut breaks ties at random)
    counts = Counter()
    for t in texts:
        counts.update(t.replace(" ", "▁"))
    alphabet = sorted(counts, key=lambda c: (-counts[c], ord(c)))[:160]
    reserved = len(SPECIAL_TOKENS) + 1 + 256  # specials, "\n", byte fallback
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - reserved + 200,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        special_tokens=[],
    )
    learner.train_from_iterator(texts, trainer=trainer)
    learnt = learner.get_vocab()
    merges = json.loads(learner.to_str())["model"]["merges"]
    ordered = sorted(learnt, key=learnt.get)  # the alphabet, then merges in the order they were learnt
    ordinary = [f"<0x{b:02X}>" for b in range(256)] + [t for t in ordered if t != "\n"]
    free = [i for i in range(vocab_size) if i not in SPECIAL_TOKENS and i != NEWLINE_ID]
    ordinary = ordinary[: len(free)]
    vocab = {tok: i for i, tok in SPECIAL_TOKENS.items()}
    vocab["\n"] = NEWLINE_ID
    vocab.update({tok: i for i, tok in zip(free, ordinary)})
    kept = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    assert len(vocab) == vocab_size, len(vocab)

    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=[tuple(m) for m in kept], unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    # the pipeline transformers' GemmaTokenizer builds, so both ways of loading it agree
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", BOS)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(SPECIAL_TOKENS.items())])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in sorted(SPECIAL_TOKENS.items())
    }
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "padding_side": "left",
        "model_max_length": 1_000_000,
        "added_tokens_decoder": added,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return tok


def encode(tok, texts: list[str], bos: bool) -> list[list[int]]:
    return [([BOS] if bos else []) + e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
