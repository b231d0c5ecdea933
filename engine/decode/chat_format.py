"""Text in and out of the model: tokenizer, chat prompt, streamed detokenizing, thought/answer, stops.

Torch-free and Qt-free: the decode loop hands token ids in and gets display text out, and the same
code serves the CLI, the worker and the tests. transformers is imported only to load a tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from flashdesk.engine.decode.literal_text import literal_specials

THOUGHT = "thought"
ANSWER = "answer"


class ChatError(ValueError):
    """A model folder's tokenizer, template or generation settings are missing or unusable."""


def load_tokenizer(model_dir: str | Path) -> Any:
    """Load the folder's tokenizer and chat template from local files only (no hub at runtime)."""
    folder = Path(model_dir)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").is_file():
        raise ChatError(f"no tokenizer in model folder {folder}: expected tokenizer.json and tokenizer_config.json")
    from transformers import AutoTokenizer  # heavy import, only when a tokenizer is needed

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ChatError(f"cannot load the tokenizer in model folder {folder}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ChatError(f"the tokenizer in model folder {folder} has no chat template (chat_template.jinja)")
    return tokenizer


def messages_from(prompt: str, system: str | None = None) -> list[dict]:
    """The message list for a single user prompt, with an optional system prompt first."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": prompt}]


def build_prompt_ids(
    tokenizer: Any, messages: list[dict], *, enable_thinking: bool, tools: list | None = None
) -> list[int]:
    """The model's input ids: the chat template with its generation prompt, as a plain list.

    Messages that end with an assistant message are a reply to go on with (one the context cut
    off): its turn is left open, without the generation prompt, so the model writes on from its
    last character (the template trims the reply's trailing white space).

    Message content is text: a special token's string in it (`<turn|>` typed by a user) is tokenized
    as its characters, so it can never close a turn or open another (literal_text.py).

    `tools`: OpenAI's function tools, declared in the system turn as Gemma 4's template does.

    transformers 5 returns a BatchEncoding by default; older versions a list. The template emits
    <bos> itself and transformers tokenizes it with add_special_tokens=False, so there is one <bos>.
    """
    continuing = bool(messages) and messages[-1].get("role") == "assistant"
    options = dict(
        add_generation_prompt=not continuing, continue_final_message=continuing, enable_thinking=enable_thinking
    )
    if tools:
        options["tools"] = tools
    literal = literal_specials(tokenizer)
    if literal.found_in(messages):  # a special token's string typed in a message is its characters
        return literal.prompt_ids(tokenizer, messages, options)
    out = tokenizer.apply_chat_template(messages, tokenize=True, **options)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def lookup_token_id(tokenizer: Any, token: str) -> int:
    """The id of a single-token string, so no special id is hard-coded."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tid == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ChatError(f"the tokenizer has no {token!r} token")
    return int(tid)


class IncrementalDetokenizer:
    """Turn a stream of token ids into text, emitting only complete characters.

    A token can end in the middle of a UTF-8 character (byte-fallback or byte-level tokens), and
    decoding depends on neighbouring tokens (leading spaces), so single tokens can't be decoded
    alone. Each step decodes a short window: `prefix_offset..read_offset` is text already emitted
    and kept as context, `read_offset..` is new. New text ending in U+FFFD is held back until the
    rest of the character arrives, so the cost per token stays bounded by the window.
    """

    # No valid UTF-8 character needs more tokens than this; beyond it the U+FFFD is real garbage
    # and is emitted, so invalid output can't make the window (and the cost per token) grow.
    MAX_HELD = 8

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text ("" while a character is incomplete)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        held = len(self._ids) - self._read
        if len(new_text) > len(prefix_text) and (not new_text.endswith("\ufffd") or held > self.MAX_HELD):
            return self._advance(new_text[len(prefix_text) :])
        return ""

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character decodes as U+FFFD) and reset."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        out = self._advance(new_text[len(prefix_text) :])
        self._ids, self._prefix, self._read = [], 0, 0
        return out

    def _advance(self, text: str) -> str:
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix > 256:  # drop ids that are no longer context
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return text


class Piece(NamedTuple):
    """A piece of streamed text and the channel it belongs to: THOUGHT or ANSWER."""

    channel: str
    text: str


class ChannelSplitter:
    """Split a streamed reply into the model's thought and its answer, by channel marker ids.

    With thinking on, Gemma 4 writes `<|channel>thought\\n...reasoning...<channel|>` and then the
    answer. The markers are single tokens, so they are matched by id (looked up by their token
    strings) and never appear in the text; the channel name line ("thought\\n") is dropped. With
    thinking off the prompt already holds the empty thought, so everything is answer. Feed it the
    generated ids without the stop token: other special tokens are passed through as text.
    """

    LABEL_MAX = 32  # a channel name longer than this without "\n" is taken as thought text

    def __init__(self, tokenizer: Any):
        self._open = lookup_token_id(tokenizer, "<|channel>")
        self._close = lookup_token_id(tokenizer, "<channel|>")
        self._detok = IncrementalDetokenizer(tokenizer)
        self._channel = ANSWER
        self._label: str | None = None  # channel name read so far, while it is not complete

    def push(self, token_id: int) -> list[Piece]:
        """Add one token; return the pieces of text it completes (often none or one)."""
        if token_id in (self._open, self._close):
            pieces = self._route(self._detok.flush(), final=True)
            self._channel = THOUGHT if token_id == self._open else ANSWER
            self._label = "" if token_id == self._open else None
            return pieces
        return self._route(self._detok.push(token_id))

    def flush(self) -> list[Piece]:
        """Return the text still held back at the end of generation."""
        return self._route(self._detok.flush(), final=True)

    def _route(self, text: str, final: bool = False) -> list[Piece]:
        if self._label is not None:
            self._label += text
            if "\n" in self._label:
                text = self._label.split("\n", 1)[1]
            elif len(self._label) > self.LABEL_MAX or (final and not self._label.strip().isidentifier()):
                text = self._label  # no channel name line after all
            elif final:
                text = ""  # a bare name, e.g. "<|channel>thought<channel|>": an empty thought
            else:
                return []
            self._label = None
        return [Piece(self._channel, text)] if text else []


class StopStrings:
    """Streaming stop-string matcher: text from a stop string on is never emitted.

    A stop string can arrive split over several pieces, so any tail that could be the start of
    one is held back until the next piece settles it.
    """

    def __init__(self, stops: list[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.hit: str | None = None  # the stop string found, once found

    def push(self, text: str) -> tuple[str, bool]:
        """Add a piece; return (text safe to emit, whether a stop string was hit)."""
        if self.hit is not None:
            return "", True
        buf = self._held + text
        found = [(buf.find(s), s) for s in self._stops if s in buf]
        if found:
            at, self.hit = min(found)
            self._held = ""
            return buf[:at], True
        keep = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of generation, the held-back tail turned out not to be a stop string."""
        out, self._held = ("" if self.hit is not None else self._held), ""
        return out


def eos_ids(model_dir: str | Path) -> set[int]:
    """The stop token ids: `eos_token_id` (an int or a list) from generation_config.json, else
    from config.json (top level, else text_config). Gemma 4 stops on <eos> and on <turn|>."""
    folder = Path(model_dir)
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ChatError(f"cannot read {path}: {exc}") from exc
        value = data.get("eos_token_id")
        if value is None:
            value = (data.get("text_config") or {}).get("eos_token_id")
        if value is not None:
            return {int(v) for v in (value if isinstance(value, list) else [value])}
    raise ChatError(f"no eos_token_id in generation_config.json or config.json in model folder {folder}")
