"""Log probabilities as the API shows them: OpenAI's chat shape per token, and the legacy completions shape.

Why the engine's thread makes the entries: a token's text needs the tokenizer, which the HTTP side
never touches (runner.py). Each entry is a plain dict in the chat shape, `{"token", "logprob",
"bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}`; the legacy shape is derived from it.

A token's text is its own decoded piece (a byte-fallback token `<0xE2>` is one byte, shown with
U+FFFD where it is not a whole character; `bytes` always has the exact bytes); control tokens show
as their strings (`<turn|>`). A log probability below FLOOR is shown as FLOOR, as vLLM does, since
JSON has no -Infinity.
"""

from __future__ import annotations

import re
from typing import Any

from flashdesk.engine.decode.logprobs import TokenLogprob

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
FLOOR = -9999.0


class TokenTexts:
    """Token id -> (text, bytes), from the engine's tokenizer (its thread only), remembered."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._known: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        known = self._known.get(token)
        if known is None:
            known = self._known[token] = self._read(token)
        return known

    def _read(self, token: int) -> tuple[str, list[int]]:
        if self._tokenizer is None:
            return "", []
        piece = self._tokenizer.convert_ids_to_tokens(token)
        byte = BYTE_PIECE.fullmatch(piece) if isinstance(piece, str) else None
        if byte is not None:
            raw = bytes([int(byte.group(1), 16)])
        else:
            text = self._tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            raw = text.encode("utf-8", errors="replace")
        return raw.decode("utf-8", errors="replace"), list(raw)


def _value(logprob: float | None) -> float | None:
    return None if logprob is None else max(logprob, FLOOR)


def entries(logprobs: list[TokenLogprob], texts: TokenTexts) -> tuple[dict, ...]:
    """The chat shape of each token (a prompt's first token has logprob and top_logprobs None)."""
    out = []
    for item in logprobs:
        text, raw = texts(item.token)
        top = None
        if item.logprob is not None:
            top = [{"token": t, "logprob": _value(v), "bytes": b} for t, b, v in ((*texts(i), v) for i, v in item.top)]
        out.append({"token": text, "logprob": _value(item.logprob), "bytes": raw, "top_logprobs": top})
    return tuple(out)


def legacy(items: list[dict], offset: int = 0) -> dict:
    """The completions API's shape of chat-shaped entries: `tokens`, `token_logprobs`, `top_logprobs`
    (a {token: logprob} map per token) and `text_offset` (each token's start in the text, from `offset`)."""
    tokens, values, tops, offsets = [], [], [], []
    for item in items:
        tokens.append(item["token"])
        values.append(item["logprob"])
        top = item["top_logprobs"]
        shown: dict[str, float] | None = None
        if top is not None:
            shown = {}
            for t in top:  # two tokens of the same text: the likelier (listed first) is kept
                shown.setdefault(t["token"], t["logprob"])
        tops.append(shown)
        offsets.append(offset)
        offset += len(item["token"])
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
