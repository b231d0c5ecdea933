"""A tiny but real Hugging Face tokenizer shaped like Gemma 4's, for tests without a model hub.

`write_tokenizer(folder)` writes tokenizer.json, tokenizer_config.json and chat_template.jinja.
The default tokenizer works like Gemma's: a BPE model with SentencePiece-style byte fallback
(`<0x00>`..`<0xFF>`), spaces written as "▁", loaded through transformers' `GemmaTokenizer` class
exactly as the real checkpoint is. Every special token sits at Gemma 4's id. Characters outside
the small vocabulary (CJK, emoji) fall back to one token per UTF-8 byte, so a streamed
detokenizer really meets half characters.

Byte fallback can never merge part of a character with something else, so `byte_level=True`
writes a GPT-2 style byte-level BPE instead (same special ids, same template), whose merges do
span partial UTF-8 characters and whose decoder is context free even for invalid byte runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

TINY_VOCAB = 512

# Gemma 4's special tokens at their real ids (docs/model.md).
SPECIAL_TOKENS: dict[int, str] = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    4: "<mask>",
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
}
NEWLINE_ID = 107  # "\n" is an ordinary vocabulary token in Gemma 4

# Common words that get their own merged tokens ("▁" marks a leading space).
_WORDS = (
    "▁the",
    "▁and",
    "▁to",
    "▁of",
    "▁a",
    "▁in",
    "▁is",
    "▁it",
    "▁you",
    "▁that",
    "▁for",
    "▁on",
    "▁with",
    "▁are",
    "▁this",
    "▁be",
    "▁at",
    "▁have",
    "▁not",
    "▁answer",
    "▁think",
    "▁world",
    "▁model",
    "▁user",
    "▁thought",
    "▁Hello",
    "▁The",
    "▁I",
    "▁what",
    "▁can",
    "▁help",
    "▁speculative",
    "Hello",
    "The",
    "thought",
    "model",
    "user",
    "system",
    "answer",
    "Let",
    "ing",
    "ed",
    "er",
    "es",
    "▁café",
    "café",
    "▁naïve",
)
_EXTRA_CHARS = ("é", "ï", "’", "—")

# Byte-level variant: merges over raw bytes. The first ones cover only part of a character or
# straddle two (你好 encodes as "你"[:2] | "你"[2:]+"好"[:1] | "好"[1:]), so decoded tokens begin
# or end in the middle of a UTF-8 sequence.
_BYTE_LEVEL_WORDS = (
    "你".encode()[:2],
    "你".encode()[2:] + "好".encode()[:1],
    "好".encode()[1:],
    "😀".encode()[:2],
    "😀".encode()[2:] + "😀".encode()[:1],
    "😀".encode()[1:3],
) + tuple(
    w.encode()
    for w in (
        " the",
        " and",
        " to",
        " of",
        " in",
        " is",
        " it",
        " you",
        " that",
        " for",
        " answer",
        " think",
        " world",
        " model",
        "Hello",
        "thought",
        "model",
        "user",
        "system",
        "ing",
        "ed",
        "é",
        "café",
        " café",
    )
)


def _gpt2_byte_chars() -> list[str]:
    """The printable character GPT-2's ByteLevel uses for each byte value 0..255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _vocab_and_merges(
    base: list[str], words: tuple[str, ...], newline: str
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Place specials at their ids, then `base` tokens, then left-to-right merge chains for `words`."""
    ordinary = list(base)
    merges: list[tuple[str, str]] = []
    known = set(ordinary)
    for word in words:
        for ch in word:
            if ch not in known:
                known.add(ch)
                ordinary.append(ch)
        prefix = word[0]
        for ch in word[1:]:
            merged = prefix + ch
            if merged not in known:
                known.add(merged)
                ordinary.append(merged)
                merges.append((prefix, ch))
            prefix = merged
    free = [i for i in range(TINY_VOCAB) if i not in SPECIAL_TOKENS and i != NEWLINE_ID]
    if len(ordinary) > len(free):
        raise ValueError(f"tiny vocabulary overflows: {len(ordinary)} tokens for {len(free)} ids")
    vocab = {tok: i for i, tok in SPECIAL_TOKENS.items()}
    vocab[newline] = NEWLINE_ID
    ordinary = [t for t in ordinary if t != newline]
    # Pad with never-produced placeholders so the vocabulary is exactly TINY_VOCAB.
    ordinary += [f"<unused{k}>" for k in range(len(free) - len(ordinary))]
    vocab.update({tok: i for i, tok in zip(free, ordinary)})
    assert len(vocab) == TINY_VOCAB and sorted(vocab.values()) == list(range(TINY_VOCAB))
    return vocab, merges


def _gemma_style() -> Tokenizer:
    base = [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + [chr(c) for c in range(33, 127)]
    base += list(_EXTRA_CHARS)
    vocab, merges = _vocab_and_merges(base, _WORDS, "\n")
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tok = Tokenizer(bpe)
    # The same pipeline transformers' GemmaTokenizer builds, so both loading paths agree.
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _byte_level() -> Tokenizer:
    chars = _gpt2_byte_chars()
    words = tuple("".join(chars[b] for b in w) for w in _BYTE_LEVEL_WORDS)
    vocab, merges = _vocab_and_merges(chars, words, chars[ord("\n")])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    # Split words GPT-2 style but keep "\n" its own pre-token, as Gemma keeps it its own token.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


# Gemma 4's chat format (docs/model.md), shared with the tiny test tokenizer and the demo pair
CHAT_TEMPLATE = (Path(__file__).resolve().parents[1] / "assets" / "gemma4_chat_template.jinja").read_text(
    encoding="utf-8"
)


def write_tokenizer(folder: Path, *, byte_level: bool = False) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = _byte_level() if byte_level else _gemma_style()
    # Gemma prepends <bos> when encoding plain text.
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
    )
    specials = [t for _, t in sorted(SPECIAL_TOKENS.items())]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    assert tok.get_vocab_size() == TINY_VOCAB
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
        # GemmaTokenizer rebuilds Gemma's pipeline from tokenizer.json's vocab and merges, as
        # for the real checkpoint; the byte-level variant must be loaded as stored.
        "tokenizer_class": "TokenizersBackend" if byte_level else "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        # As in Gemma: plain encode() adds <bos>; apply_chat_template tokenizes with
        # add_special_tokens=False, so the template's own <bos> stays the only one.
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "padding_side": "left",
        "model_max_length": 1_000_000,
        "added_tokens_decoder": added,
    }
    text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    (folder / "tokenizer_config.json").write_text(text, encoding="utf-8")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
