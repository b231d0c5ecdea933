"""Constrained decoding: a request's grammar as a token mask at every position it samples (llguidance).

Why a mask per position: a speculative step scores the last token and K drafts in one target pass,
and row i of that pass must be masked with the grammar's state after the first i drafts, exactly as
plain decoding would mask it after emitting them. So a step walks the matcher through its drafts
(`Walk`): each draft row is masked with the state before it (drafts stay within the grammar, and
more of them are accepted), the target's rows get the same masks plus the one after the last
draft, and `settle` rolls the matcher back to the accepted drafts and takes the target's own token.
A draft the grammar refuses is simply a rejection at that position: its masked target probability
is 0. Sampling from masked logits is sampling from the grammar-restricted distribution, and the
rejection rule keeps that exact (sampling.verify_draft), so speculation stays lossless.

The matcher runs on the host and needs each drafted token, so a constrained step reads its drafts
back as it draws them; unconstrained steps are untouched. Masks are llguidance's bitmasks (one bit a
token, int32 words), unpacked on the logits' device.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

# JSON as a reply is usually written: no free white space for a model to wander in, the usual separators
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """A request's grammar, as llguidance's grammar text."""

    spec: str


def lark(text: str) -> Grammar:
    return Grammar(llguidance.LLMatcher.grammar_from_lark(text))


def json_rule(schema: dict | None) -> str:
    """A Lark rule body for JSON matching `schema` (None: any JSON object), in JSON_STYLE."""
    schema = dict(schema) if schema else {"type": "object"}
    schema["x-guidance"] = dict(JSON_STYLE)  # ours alone: a request's own options would reach llguidance
    return "%json " + json.dumps(schema, ensure_ascii=False)


def thought_rule(open_id: int, close_id: int) -> str:
    """An optional thought channel before the constrained part: <|channel>...<channel|> (with thinking on)."""
    return f"<[{open_id}]> /(?s:.*)/ <[{close_id}]>"


def json_grammar(schema: dict | None, thought: tuple[int, int] | None = None) -> Grammar:
    """JSON matching `schema` as the whole answer; with `thought` (the channel's open and close ids),
    a thought may come first."""
    if thought is None:
        return lark(f"start: {json_rule(schema)}\n")
    return lark(f"start: thought? answer\nthought: {thought_rule(*thought)}\nanswer: {json_rule(schema)}\n")


def check(grammar: Grammar) -> str:
    """Why the grammar cannot be used ('' when it can): an unknown type, a bad pattern, a Lark error."""
    return llguidance.LLMatcher.validate_grammar(grammar.spec)


_vocabularies: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def vocabulary(tokenizer: Any, vocab_size: int, end_id: int) -> llguidance.LLTokenizer:
    """llguidance's view of the tokenizer (each token's bytes, which are special), made once per
    tokenizer (about a second at Gemma 4's 262,144 tokens). `end_id` is the only token a finished
    grammar allows: the end of the model's turn."""
    key = (vocab_size, end_id)
    with _lock:
        known = _vocabularies.setdefault(tokenizer, {})
        if key not in known:
            known[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=end_id)
        return known[key]


class GrammarState:
    """One generation's matcher, and its masks on the logits' device."""

    def __init__(self, vocab: llguidance.LLTokenizer, grammar: Grammar, device: torch.device):
        self.matcher = llguidance.LLMatcher(vocab, grammar.spec, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the grammar cannot be used: {self.matcher.get_error()}")
        self.vocab_size = vocab.vocab_size
        self.end_ids = frozenset(vocab.eos_tokens)
        self.words = (self.vocab_size + 31) // 32
        self.device = device
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)

    def bitmask(self) -> torch.Tensor:
        """The current state's allowed tokens: int32 words [W] on the host, bit j of word i for token 32i + j."""
        out = torch.empty(self.words, dtype=torch.int32)
        self.matcher.unsafe_compute_mask_ptr(out.data_ptr(), self.words * 4)
        return out

    def apply(self, logits: torch.Tensor, bitmasks: torch.Tensor) -> torch.Tensor:
        """logits [n, V] with the tokens each row's bitmask [n, W] forbids at -inf (a new tensor)."""
        if self.device.type == "cpu":  # numpy unpacks bits several times faster than torch's shifts here
            bits = np.unpackbits(bitmasks.numpy().view(np.uint8), axis=-1, bitorder="little")
            allowed = torch.from_numpy(bits.view(np.bool_))
        else:
            words = bitmasks.to(self.device, non_blocking=True)
            allowed = ((words.unsqueeze(-1) >> self._shifts) & 1).view(words.shape[0], -1).bool()
        vocab = logits.shape[-1]
        if allowed.shape[-1] < vocab:  # ids past the tokenizer's: never allowed
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]))
        return logits.masked_fill(~allowed[:, :vocab], float("-inf"))

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [1, V] masked with the current state."""
        return self.apply(logits, self.bitmask().unsqueeze(0))

    def consume(self, token: int) -> bool:
        """Advance past `token`; False (and no change) when the grammar refuses it, or when it is the
        end token of a finished grammar (which ends the reply, and is no part of the matcher's history)."""
        return self.matcher.try_consume_tokens([int(token)]) == 1

    def rollback(self, tokens: int) -> None:
        if tokens and not self.matcher.rollback(tokens):
            raise RuntimeError(f"the grammar could not take back {tokens} tokens: {self.matcher.get_error()}")

    def walk(self) -> "Walk":
        return Walk(self)

    def settle(self, walk: "Walk", accepted: int, bonus: int) -> None:
        """After a verified step: keep the `accepted` drafts the walk consumed, then take the target's token."""
        self.rollback(walk.consumed - min(accepted, walk.consumed))
        self.consume(bonus)

    def accepting(self) -> bool:
        """Whether what was consumed so far is a complete sentence of the grammar."""
        return self.matcher.is_accepting()


class Walk:
    """One speculative step's path through its drafts: the bitmask before each draft and after the
    last, the matcher advanced past each draft it allows. Once a draft is refused, the rows after it
    cannot be accepted, and are left unmasked; so are the rows after the end token of a finished
    grammar (the reply ends there)."""

    def __init__(self, state: GrammarState):
        self.state = state
        self.bitmasks: list[torch.Tensor] = []
        self.consumed = 0  # drafts the matcher advanced past (the end token is not one)
        self.refused = False

    def _next(self) -> torch.Tensor:
        if self.refused:
            return torch.full((self.state.words,), -1, dtype=torch.int32)
        return self.state.bitmask()

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """A draft row [1, V] masked with the state before it (recorded for the target's row)."""
        bitmask = self._next()
        self.bitmasks.append(bitmask)
        return self.state.apply(logits, bitmask.unsqueeze(0))

    def take(self, token: torch.Tensor | int) -> None:
        """Advance past a drafted token (read from the device: the matcher is on the host)."""
        if not self.refused:
            if self.state.consume(int(token)):
                self.consumed += 1
            else:
                self.refused = True

    def target(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's rows [k + 1, V], each masked with the state after the drafts before it."""
        rows = self.bitmasks + [self._next()]
        return self.state.apply(logits, torch.stack(rows[: logits.shape[0]]))

    def undo(self) -> None:
        """Take back every draft the walk consumed (the step is abandoned)."""
        self.state.rollback(self.consumed)
        self.consumed = 0
