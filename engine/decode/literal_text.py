"""Message content is text: a special token's string typed in it (`<turn|>`, `<bos>`, `<|channel>`) is
tokenized as its characters, never as the control token, so nobody can forge a turn, a system
prompt or a thought by typing its markers (in the API, `flashdesk chat` or the app alike).

Why this way: the chat template writes the content into one string beside its own markers, and the
tokenizer cannot tell the two apart afterwards. So each special token's string in the content is
swapped for a placeholder the template passes through untouched, the template is rendered, the text
is cut at the markers that remain (the template's own), and each piece between them is tokenized
with special-token parsing off, its placeholders turned back into their text first. The tokenizer
cuts its input at special tokens in the same way before it tokenizes the pieces, so the pieces
tokenize as they always did; only the typed markers change. Content without any special token's
string never comes here (chat_format.build_prompt_ids takes the tokenizer's own path).
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Callable

PRIVATE_USE = range(0xF0000, 0xFFFFE)  # plane 15: characters no text of ours is expected to hold


def _trie_pattern(strings: list[str]) -> str:
    """One regex matching any of `strings`, leftmost-longest, as a trie: a tokenizer may have thousands
    of special tokens, and a flat alternation would try each at every '<' of a long prompt."""
    trie: dict = {}
    for text in strings:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 and len(branches[0]) == 1 else f"(?:{'|'.join(branches)})"
        return f"(?:{body})?" if "" in node else body

    return build(trie)


class LiteralSpecials:
    """A tokenizer's special tokens, and how to tokenize text with their strings read as characters."""

    def __init__(self, tokenizer: Any):
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        special = {tid: tok for tid, tok in added.items() if getattr(tok, "special", False) and str(tok)}
        self.ids = {str(tok): int(tid) for tid, tok in special.items()}
        self.lstrip = {str(tok) for tok in special.values() if getattr(tok, "lstrip", False)}
        self.rstrip = {str(tok) for tok in special.values() if getattr(tok, "rstrip", False)}
        self.pattern = re.compile(_trie_pattern(list(self.ids))) if self.ids else None
        self.encode = _literal_encoder(tokenizer)

    def found_in(self, messages: list[dict]) -> bool:
        return self.pattern is not None and any(self.pattern.search(text) for text in _texts(messages))

    def prompt_ids(self, tokenizer: Any, messages: list[dict], options: dict) -> list[int]:
        """The chat template's ids for `messages` (apply_chat_template's `options`), typed markers as text."""
        pattern = self.pattern
        assert pattern is not None  # called only when found_in: the tokenizer has special tokens
        texts = list(_texts(messages))
        mark = next(chr(c) for c in PRIVATE_USE if not any(chr(c) in text for text in texts))
        typed: list[str] = []

        def hide(match: re.Match) -> str:
            typed.append(match.group(0))
            return f"{mark}{len(typed) - 1}{mark}"

        escaped = [_map_text(m, lambda text: pattern.sub(hide, text)) for m in messages]
        rendered = tokenizer.apply_chat_template(escaped, tokenize=False, **options)
        restore = re.compile(f"{re.escape(mark)}(\\d+){re.escape(mark)}")
        ids: list[int] = []
        pieces = _split_keep(pattern, rendered)
        for i, piece in enumerate(pieces):
            if i % 2:  # one of the template's own markers
                ids.append(self.ids[piece])
                continue
            if i > 0 and pieces[i - 1] in self.rstrip:
                piece = piece.lstrip()
            if i + 1 < len(pieces) and pieces[i + 1] in self.lstrip:
                piece = piece.rstrip()
            if piece:
                ids += self.encode(restore.sub(lambda m: typed[int(m.group(1))], piece))
        return ids


def _split_keep(pattern: re.Pattern, text: str) -> list[str]:
    """text cut at the pattern's matches: [text, match, text, match, ..., text]."""
    out, at = [], 0
    for match in pattern.finditer(text):
        out += [text[at : match.start()], match.group(0)]
        at = match.end()
    return out + [text[at:]]


def _texts(messages: list[dict]):
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]


def _map_text(message: dict, change: Callable[[str], str]) -> dict:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": change(content)}
    if isinstance(content, list):
        texts = [isinstance(part, dict) and isinstance(part.get("text"), str) for part in content]
        parts = [{**part, "text": change(part["text"])} if text else part for part, text in zip(content, texts)]
        return {**message, "content": parts}
    return message


def _literal_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """Text -> ids with special-token parsing off. A fast tokenizer's own pipeline is copied once with
    the switch set, so tokenizing never changes a setting another thread's tokenizer is using."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        from tokenizers import Tokenizer

        clone = Tokenizer.from_str(backend.to_str())
        clone.no_truncation()
        clone.no_padding()
        clone.encode_special_tokens = True
        return lambda text: clone.encode(text, add_special_tokens=False).ids
    return lambda text: list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


_known: "weakref.WeakKeyDictionary[Any, LiteralSpecials]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def literal_specials(tokenizer: Any) -> LiteralSpecials:
    """The tokenizer's LiteralSpecials, made once per tokenizer."""
    with _lock:
        try:
            found = _known.get(tokenizer)
        except TypeError:  # not weakly referable: made each time
            return LiteralSpecials(tokenizer)
        if found is None:
            found = _known[tokenizer] = LiteralSpecials(tokenizer)
        return found
