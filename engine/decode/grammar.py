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
back as it draws them (greedy: a few likeliest tokens a row, at once, and a mask only where a row's
choice needs one, speculative.py); unconstrained steps are untouched. Masks are llguidance's bitmasks
(one bit a token, int32 words), unpacked on the logits' device. `GrammarState.seconds` adds up the host
time spent in the grammar, for the bench's share of a step.
"""

from __future__ import annotations

import functools
import json
import threading
import time
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


class GrammarError(RuntimeError):
    """The matcher failed mid-reply (a resource limit, a token it could not take). It then allows only the
    end token, which would end the reply quietly as if it were whole: the generation stops with this instead."""


def _timed(method):
    """Add the method's time to its GrammarState's `seconds` (perf_counter: well under a microsecond)."""

    @functools.wraps(method)
    def timed(self, *args):
        started = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            self.seconds += time.perf_counter() - started

    return timed


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
        self._forbidden = torch.tensor(float("-inf"), device=device)
        self.seconds = 0.0  # host time spent in the methods below
        self._forced_ahead: list[int] = []  # the forced tokens from here on, while they are taken in turn
        self._unforced_here = False  # known: the current state forces nothing (asked, or just past a run)
        self._free = False  # known: the current state forces no bytes (asked here)
        # asking for the forced bytes forces them into the parser, as a mask would, except where the grammar
        # turns forcing off: there the question would change the answers, so it is not asked
        self._forcing = vocab.is_canonical and "no_forcing" not in grammar.spec

    @_timed
    def bitmask(self) -> torch.Tensor:
        """The current state's allowed tokens: int32 words [W] on the host, bit j of word i for token 32i + j."""
        out = torch.empty(self.words, dtype=torch.int32)
        self.matcher.unsafe_compute_mask_ptr(out.data_ptr(), self.words * 4)
        self._check()
        return out

    def _check(self) -> None:
        if self.matcher.is_error():
            error = self.matcher.get_error().strip().split("\n")[0][:500]  # not its state and grammar dump
            raise GrammarError(f"the reply could not be held to its grammar: {error}")

    @_timed
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
        return torch.where(allowed[:, :vocab], logits, self._forbidden)  # twice masked_fill's speed on the CPU

    @_timed
    def masked_argmax(self, row: torch.Tensor, bitmask: torch.Tensor) -> tuple[int, bool]:
        """The likeliest token of a row of logits [1, V] that a bitmask [W] allows (the first among
        ties, as argmax), and whether its score is finite (not where the row rules out every token
        the mask allows: suppressed tokens, a drafter's reduced vocabulary). On the CPU in numpy, a
        few times faster than masking a tensor; on a GPU masked there, then read."""
        if self.device.type == "cpu":
            allowed = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little").view(np.bool_)
            scores = row[0].float().numpy()
            allowed = allowed[: scores.shape[0]]
            masked = np.where(allowed, scores[: allowed.shape[0]], -np.inf)
            token = int(masked.argmax())
            return token, bool(np.isfinite(masked[token]))
        masked_row = self.apply(row, bitmask[None])[0]
        best = masked_row.argmax()
        token, finite = torch.stack([best, torch.isfinite(masked_row[best]).long()]).tolist()
        return token, bool(finite)

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [1, V] masked with the current state."""
        return self.apply(logits, self.bitmask().unsqueeze(0))

    @_timed
    def forced(self) -> int | None:
        """The one token the current state allows, where the grammar forces it (a JSON key, a
        separator), else None: llguidance's fast-forward tokens, several times cheaper than a mask.
        Where they exist, the mask allows exactly the first, and after it is taken exactly the next
        (tests/test_structured_output.py), so one call serves a run of them (about 3.7 on JSON).
        The forced bytes are asked first: where there are none (most states that force no token),
        that one call says so, and the state is `free`."""
        if not self._forced_ahead and not self._unforced_here:
            self._free = self._forcing and not self.matcher.compute_ff_bytes()
            self._forced_ahead = [] if self._free else [int(t) for t in self.matcher.compute_ff_tokens()]
            self._unforced_here = not self._forced_ahead
        return self._forced_ahead[0] if self._forced_ahead else None

    def free(self) -> bool:
        """Whether the current state forces no bytes at all, as `forced` found it here (never where
        the grammar turns forcing off): its mask is then exactly the tokens the matcher takes
        (llguidance masks a state's forced bytes as a prefix every allowed token must start with,
        and allows the end token only where the grammar may end), so `valid` is the rule for any
        other token (tests/test_structured_output.py)."""
        return self._unforced_here and self._free

    @_timed
    def valid(self, token: int) -> bool:
        """Whether the matcher would take `token` here (no mask computed, about a microsecond). Not
        the rule: the mask may still leave it out (see `allows`); a draft may go by it, a kept token not."""
        return self.matcher.validate_tokens([int(token)]) == 1

    @_timed
    def allows(self, bitmask: torch.Tensor, token: int) -> bool:
        """Whether a bitmask [W] lets `token` through (an id past the tokenizer's never is). The mask,
        not `consume`, is the rule: the matcher takes some tokens its mask leaves out (a string's
        closing quote alone, where the mask keeps only the quote joined to what follows)."""
        word = token >> 5
        return word < bitmask.shape[0] and bool((int(bitmask.numpy()[word]) >> (token & 31)) & 1)

    @_timed
    def consume(self, token: int) -> bool:
        """Advance past `token`; False (and no change) when the grammar refuses it, or when it is the
        end token of a finished grammar (which ends the reply, and is no part of the matcher's history);
        GrammarError when the matcher has failed, or refuses a token its own mask allowed (llguidance
        forces a literal's `<turn|>` as that control token, then refuses it: the reply would stall there)."""
        token = int(token)
        taken = self.matcher.try_consume_tokens([token]) == 1
        self._check()
        if taken:  # a forced run goes on past its own token (and ends where llguidance's run ends); any other leaves it
            self._free = False
            in_run = self._forced_ahead[:1] == [token]
            self._forced_ahead = self._forced_ahead[1:] if in_run else []
            self._unforced_here = in_run and not self._forced_ahead
        if not taken and token not in self.end_ids and token < self.vocab_size:
            word = int(self.bitmask()[token >> 5])
            if (word >> (token & 31)) & 1:
                raise GrammarError(
                    f"the reply could not be held to its grammar: token {token}, which its mask allowed, was refused"
                )
        return taken

    def keep(self, token: int) -> None:
        """Take a token the reply keeps (chosen under the mask): GrammarError where the grammar refuses
        it, which happens only when no allowed token could be chosen (the sampling suppresses every
        token the grammar allows there): the reply cannot go on within its grammar."""
        if not self.consume(token) and int(token) not in self.end_ids:
            raise GrammarError("the reply could not be held to its grammar: no token it allows could be chosen")

    @_timed
    def rollback(self, tokens: int) -> None:
        if tokens:
            self._forced_ahead, self._unforced_here, self._free = [], False, False
        if tokens and not self.matcher.rollback(tokens):
            raise RuntimeError(f"the grammar could not take back {tokens} tokens: {self.matcher.get_error()}")

    def walk(self) -> "Walk":
        return Walk(self)

    def settle(self, walk: "Walk", accepted: int, bonus: int) -> None:
        """After a verified step: keep the `accepted` drafts the walk consumed, then take the target's token."""
        self.rollback(walk.consumed - min(accepted, walk.consumed))
        if accepted <= walk.consumed:  # else the drafts ended with a finished grammar's end token: so does the reply
            self.keep(bonus)

    def accepting(self) -> bool:
        """Whether what was consumed so far is a complete sentence of the grammar."""
        return self.matcher.is_accepting()


class Walk:
    """One speculative step's path through its drafts, the matcher advanced past each draft it
    takes. A sampled step records the bitmask before each draft and after the last; a greedy one,
    what the grammar forced at each row it walked. Once a draft is refused, the rows after it cannot
    be accepted, and are left unmasked; so are the rows after the end token of a finished grammar
    (the reply ends there)."""

    def __init__(self, state: GrammarState):
        self.state = state
        self.bitmasks: list[torch.Tensor] = []
        self.consumed = 0  # drafts the matcher advanced past (not an end token, which ends the reply)
        # row by row, as far as greedy drafting walked: whether the grammar forced its token; whether it forced no byte
        self.forced: list[bool] = []
        self.free: list[bool] = []
        self.refused = False

    def _next(self) -> torch.Tensor:
        if self.refused:
            return torch.full((self.state.words,), -1, dtype=torch.int32)
        return self.state.bitmask()

    def next_mask(self) -> torch.Tensor:
        """The bitmask [W] at the walk's state: before the next draft (recorded for the target's row)."""
        bitmask = self._next()
        self.bitmasks.append(bitmask)
        return bitmask

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """A draft row [1, V] masked with the state before it (recorded for the target's row)."""
        return self.state.apply(logits, self.next_mask().unsqueeze(0))

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
