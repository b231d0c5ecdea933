"""A chat request's prompt, made on the HTTP side before the request is queued: a cheap size bound,
then the chat template and the tokenizer, once, on threads of their own.

Why not on the engine's thread: the engine runs one request at a time, and tokenizing a prompt of
megabytes takes long enough to stall every request behind it; a refusal must not cost the engine
anything either. The ids made here go to the engine with the job, which only matches them against
its prefix cache. Each thread tokenizes with its own copy of the tokenizer: a fast tokenizer must
not be used by two threads at once.

The cheap bound: no token of the vocabulary spells more than `longest` characters, so messages of
N characters make at least N / longest tokens. Messages that cannot fit however they tokenize are
refused before the template is even rendered (the body's size is bounded before that, body.py).

The reply's room: with `max_tokens`, the prompt must leave it min(max_tokens, a quarter of the
context), as in the app; without, the reply may take what the context leaves after the prompt, at
most DEFAULT_REPLY_CAP tokens, and only a prompt that fills the context is refused.

A raw prompt (/v1/completions) is the model's input as written: its text is tokenized with control
tokens read as such (it may write Gemma 4's chat format itself) and a <bos> put first unless it
begins with one; token ids are taken as they are. It must leave room for all of `max_tokens`, as
vLLM asks.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jinja2 import TemplateError

from flashdesk.engine.decode.chat_format import build_prompt_ids
from flashdesk.engine.decode.conversation import FittedPrompt, check_messages, reply_room
from flashdesk.engine.decode.literal_text import literal_specials
from flashdesk.engine.errors import FlashDeskError
from flashdesk.engine.serve.errors import ApiError

DEFAULT_REPLY_CAP = 32768  # tokens a reply without max_tokens may take, if the context leaves them
THREADS = 2
TOO_LONG = "context_length_exceeded"


def fitted_text(ids: list[int], context_limit: int, max_tokens: int | None) -> FittedPrompt:
    """A raw prompt's `ids` with room for `max_tokens` (None: what the context leaves, up to
    DEFAULT_REPLY_CAP; 0: the prompt alone, which still runs one token), or a 400."""
    room = 1 if max_tokens is None else max(1, max_tokens)
    if len(ids) + room > context_limit:
        raise ApiError(
            400,
            f"the prompt is {len(ids)} tokens and the reply needs {room} more (max_tokens), over this model's "
            f"context of {context_limit} tokens: shorten the prompt or lower max_tokens",
            "prompt",
            TOO_LONG,
        )
    left = context_limit - len(ids)
    reply = room if max_tokens is not None else min(left, DEFAULT_REPLY_CAP)
    return FittedPrompt(ids, [], dropped=0, max_new_tokens=reply, capped=max_tokens is None and reply == left)


def fitted_for(ids: list[int], messages: list[dict], context_limit: int, max_tokens: int | None) -> FittedPrompt:
    """The prompt `ids` with its reply's limit, or a 400 when the context cannot hold both."""
    prompt = len(ids)
    if max_tokens is None:
        left = context_limit - prompt
        if left < 1:
            raise ApiError(
                400,
                f"the messages make a prompt of {prompt} tokens, which fills this model's context of "
                f"{context_limit} tokens and leaves no room for a reply: shorten the messages",
                "messages",
                TOO_LONG,
            )
        reply = min(left, DEFAULT_REPLY_CAP)
        return FittedPrompt(ids, messages, dropped=0, max_new_tokens=reply, capped=reply == left)
    room = reply_room(context_limit, max_tokens)
    if prompt + room > context_limit:
        raise ApiError(
            400,
            f"the messages make a prompt of {prompt} tokens and the reply needs at least {room} more "
            f"(max_tokens, up to a quarter of the context), over this model's context of {context_limit} "
            "tokens: shorten the messages or lower max_tokens",
            "messages",
            TOO_LONG,
        )
    reply = min(max_tokens, context_limit - prompt)
    return FittedPrompt(ids, messages, dropped=0, max_new_tokens=reply, capped=reply < max_tokens)


def _strings(value) -> list[str]:
    """Every string in nested lists, tuples and dicts (their keys too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


class PromptMaker:
    """Prompts for one tokenizer and context, made on `threads` threads."""

    def __init__(self, tokenizer: Any, context_limit: int, threads: int = THREADS):
        self.context_limit = context_limit
        self.longest = max((len(token) for token in tokenizer.get_vocab()), default=1) or 1
        self.specials = literal_specials(tokenizer).pattern  # control tokens' strings
        self._copies: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(threads):
            self._copies.put(copy.deepcopy(tokenizer))
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="flashdesk-prompt")

    def check_size(self, messages: list[dict], max_tokens: int | None, tools: list | None = None) -> None:
        """Refuse messages (and tools, and earlier calls) too long for the context whatever they
        tokenize to (no tokenizing); and control tokens' strings in tools and calls, which only
        message content is guarded against (literal_text.py)."""
        chars = sum(len(m["content"]) for m in messages)
        extra = [tools or [], *[(m.get("tool_calls"), m.get("name")) for m in messages]]
        for text in _strings(extra):
            chars += len(text)
            if self.specials is not None and (found := self.specials.search(text)):
                raise ApiError(
                    400,
                    f"a tool's text (its name, description, parameters, or a call's name or arguments) holds "
                    f"the string of the control token {found.group()!r}, which the chat template would read as "
                    "that token: leave it out",
                    "tools",
                )
        least = -(-chars // self.longest)
        room = reply_room(self.context_limit, max_tokens) if max_tokens is not None else 1
        if least + room > self.context_limit:
            raise ApiError(
                400,
                f"the messages are {chars} characters, at least {least} tokens (no token of this model "
                f"spells more than {self.longest} characters), and the reply needs {room} more: over this "
                f"model's context of {self.context_limit} tokens",
                "messages",
                TOO_LONG,
            )

    async def fit(
        self, messages: list[dict], thinking: bool, max_tokens: int | None, tools: list | None = None
    ) -> FittedPrompt:
        """The chat prompt of `messages` (with `tools` declared), fitted (fitted_for)."""
        self.check_size(messages, max_tokens, tools)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._fit, messages, thinking, max_tokens, tools)

    async def fit_text(self, prompt: str | list[int], max_tokens: int | None) -> FittedPrompt:
        """A raw prompt, text (tokenized on this maker's threads) or token ids, fitted (fitted_text)."""
        if isinstance(prompt, list):
            return fitted_text(list(prompt), self.context_limit, max_tokens)
        least = -(-len(prompt) // self.longest)
        if least + (1 if max_tokens is None else max(1, max_tokens)) > self.context_limit:
            raise ApiError(
                400,
                f"the prompt is {len(prompt)} characters, at least {least} tokens, which with max_tokens is over "
                f"this model's context of {self.context_limit} tokens",
                "prompt",
                TOO_LONG,
            )
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(self._pool, self._text_ids, prompt)
        return fitted_text(ids, self.context_limit, max_tokens)

    async def text_of(self, ids: list[int]) -> str:
        """The text of token ids (an echoed prompt given as ids), control tokens as their strings."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._decode, ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer().decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _text_ids(self, text: str) -> list[int]:
        tokenizer = self._tokenizer()
        try:
            text.encode("utf-8")  # a lone surrogate (JSON's \\ud800) has no UTF-8
            ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
        except (ValueError, TypeError, UnicodeError) as exc:
            raise ApiError(400, f"the prompt cannot be tokenized: {exc}", "prompt") from None
        bos = tokenizer.bos_token_id
        return ids if bos is None or ids[:1] == [bos] else [bos] + ids

    def _tokenizer(self):
        """This thread's own copy of the tokenizer."""
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            tokenizer = self._local.tokenizer = self._copies.get()
        return tokenizer

    def _fit(self, messages: list[dict], thinking: bool, max_tokens: int | None, tools=None) -> FittedPrompt:
        tokenizer = self._tokenizer()
        try:
            check_messages(messages)
            ids = build_prompt_ids(tokenizer, messages, enable_thinking=thinking, tools=tools)
        except (FlashDeskError, ValueError, TemplateError) as exc:
            raise ApiError(400, f"the messages cannot be made into a prompt: {exc}", "messages") from None
        return fitted_for(ids, messages, self.context_limit, max_tokens)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
