"""One assistant reply as it streams: its text, thought, origins and the numbers of its footer.

Why its own object: the chat view, the speculation and telemetry panels and the store all read the
same growing reply; this keeps the one copy of it and computes the per-message statistics
(decode tok/s, time to first token, prefill speed, mean acceptance length, J/token) from the
worker's own step timestamps, so IPC and repaint delays do not bend the numbers. It also keeps what
the engine said about the context: the prompt tokens reused from earlier turns, the oldest messages
left out to fit, and the reply's limit once capped to the room left. Qt-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flashdesk import protocol as p
from flashdesk.protocol import METHOD_NAMES

LIVE_WINDOW_S = 1.0  # live tok/s: tokens of the last second
METHOD_FIGURES = ("drafted", "accepted", "acceptance_rate", "mean_acceptance_length")  # kept per method


@dataclass
class Reply:
    request_id: str
    message_id: int
    sent_at: float  # time.monotonic() when the request was sent
    energy_start_mj: int | None = None
    answer: list[str] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)
    origins: list[list] = field(default_factory=list)  # [[chars, "d"|"t"], ...] over the answer
    tokens: int = 0
    prompt_tokens: int | None = None
    first_token_at: float | None = None  # time.monotonic() when step 0 reached the app
    prefill_seconds: float | None = None
    first_elapsed: float | None = None  # worker time of step 0
    last_elapsed: float | None = None
    thought_first: float | None = None  # worker times of the first and last thought text
    thought_last: float | None = None
    spec: dict | None = None  # the engine's running speculation statistics
    draft_lengths: set = field(default_factory=set)
    recent: list[tuple[float, int]] = field(default_factory=list)  # (worker elapsed, tokens) of recent steps
    finish_reason: str | None = None
    energy_j: float | None = None
    saved_at: float = 0.0
    requested_max_tokens: int | None = None  # what the conversation's settings asked for
    max_tokens: int | None = None  # the limit the engine used: capped to the room the context leaves
    reused_tokens: int | None = None  # prompt tokens found in the engine's cache (not prefilled)
    prefill_tokens: int | None = None  # prompt tokens prefilled
    dropped_messages: int = 0  # the oldest messages the engine left out of the prompt to fit
    started: bool = False  # the engine accepted the request (Started arrived)
    user_message_id: int | None = None  # the user message this turn added (send), if any
    user_text: str = ""
    edited: int | None = None  # an edit: the user message this turn is a new version of
    before: str = ""  # a reply the context cut off, continued: its text so far, which the new text follows
    cut_chars: int = 0  # characters of the start of that text left out of the prompt to fit
    thought_before: str = ""  # and its thought, shown while it goes on
    stats_before: dict | None = None  # and its statistics: the token count and energy go on from them
    thought_seconds_before: float | None = None

    # -- streaming ----------------------------------------------------------------------------------

    def start(self, msg: p.Started) -> None:
        self.started = True
        self.prompt_tokens = msg.prompt_tokens
        self.reused_tokens = msg.reused_tokens
        self.prefill_tokens = msg.prompt_tokens - msg.reused_tokens
        self.dropped_messages = msg.dropped_messages
        self.max_tokens = msg.max_tokens or None
        self.cut_chars = msg.cut_chars

    def add_steps(self, steps: list) -> None:
        for step in steps:
            self._add(step)

    def _add(self, step: p.Step) -> None:
        if step.index == 0:
            self.first_token_at = getattr(step, "received", time.monotonic())
            self.prefill_seconds = step.seconds
            self.first_elapsed = step.elapsed
        self.last_elapsed = step.elapsed
        self.tokens += len(step.emitted)
        if step.answer:
            self.answer.append(step.answer)
            for n, origin in step.spans or [[len(step.answer), p.TARGET]]:
                if self.origins and self.origins[-1][1] == origin:
                    self.origins[-1][0] += n
                else:
                    self.origins.append([n, origin])
        if step.thought:
            self.thought.append(step.thought)
            if self.thought_first is None:
                self.thought_first = step.elapsed
            self.thought_last = step.elapsed
        if step.draft:
            self.draft_lengths.add(len(step.draft))
        if step.stats:
            self.spec = step.stats
        self.recent.append((step.elapsed, len(step.emitted)))
        cutoff = step.elapsed - LIVE_WINDOW_S * 2
        while self.recent and self.recent[0][0] < cutoff:
            self.recent.pop(0)

    def finish(self, msg: p.Finished, energy_end_mj: int | None) -> None:
        self.finish_reason = msg.reason
        if msg.stats:
            self.spec = msg.stats
        if msg.prompt_tokens:
            self.prompt_tokens = msg.prompt_tokens
        stats = msg.stats or {}
        if stats.get("reused_tokens") is not None:  # the engine's own count, once it ran
            self.reused_tokens = int(stats["reused_tokens"])
        if stats.get("prefill_tokens") is not None:
            self.prefill_tokens = int(stats["prefill_tokens"])
        if self.energy_start_mj is not None and energy_end_mj is not None and energy_end_mj >= self.energy_start_mj:
            self.energy_j = (energy_end_mj - self.energy_start_mj) / 1000.0

    # -- what the window shows ----------------------------------------------------------------------

    @property
    def text(self) -> str:
        return self.before + "".join(self.answer)

    @property
    def thought_text(self) -> str:
        return self.thought_before + "".join(self.thought)

    @property
    def thought_seconds(self) -> float | None:
        if self.thought_first is None:
            return self.thought_seconds_before
        start = self.first_elapsed or 0.0
        return max(0.0, (self.thought_last or start) - start)

    def live_tokens_per_second(self) -> float | None:
        """Tokens of the last second of worker time (None before two steps)."""
        if len(self.recent) < 2:
            return None
        end = self.recent[-1][0]
        window = [(t, n) for t, n in self.recent if t >= end - LIVE_WINDOW_S]
        if len(window) < 2:
            window = self.recent[-2:]
        span = window[-1][0] - window[0][0]
        return sum(n for _, n in window[1:]) / span if span > 0 else None

    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first over the worker time they took."""
        if self.first_elapsed is None or self.last_elapsed is None or self.tokens < 2:
            return None
        span = self.last_elapsed - self.first_elapsed
        return (self.tokens - 1) / span if span > 0 else None

    def stats(self) -> dict:
        """The per-message record the store keeps and the footer shows."""
        spec = self.spec or {}
        ttft = self.first_token_at - self.sent_at if self.first_token_at is not None else None
        prefilled = self.prefill_tokens if self.prefill_tokens is not None else self.prompt_tokens
        prefill_tps = prefilled / self.prefill_seconds if prefilled and self.prefill_seconds else None
        return {
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "decode_tokens_per_second": self.decode_tokens_per_second(),
            "ttft_seconds": ttft,
            "prefill_tokens_per_second": prefill_tps,
            "mean_acceptance_length": spec.get("mean_acceptance_length"),
            "acceptance_rate": spec.get("acceptance_rate"),
            "drafted": spec.get("drafted"),
            "accepted": spec.get("accepted"),
            "per_position_acceptance": spec.get("per_position_acceptance") or [],
            "accepted_histogram": spec.get("accepted_histogram") or [],
            "draft_lengths": sorted(self.draft_lengths),
            # each method that drafted (DFlash, MTP): its own acceptance
            "methods": {
                name: {key: figures.get(key) for key in METHOD_FIGURES}
                for name, figures in (spec.get("by_method") or {}).items()
            },
            "energy_joules": self.energy_j,
            "joules_per_token": self.energy_j / self.tokens if self.energy_j is not None and self.tokens else None,
            "finish_reason": self.finish_reason,
            "prefill_seconds": self.prefill_seconds,
            "reused_tokens": self.reused_tokens,
            "prefill_tokens": self.prefill_tokens,
            "dropped_messages": self.dropped_messages,
            "cut_chars": self.cut_chars,
            "max_tokens": self.max_tokens,
            "requested_max_tokens": self.requested_max_tokens,
            "origins": self.origins,
        } | self._continued()

    def _continued(self) -> dict:
        """A reply written on: its token count and energy are the whole reply's, its speeds the new part's."""
        before = self.stats_before
        if not before:
            return {}
        tokens = self.tokens + int(before.get("tokens") or 0)
        energy = None
        if self.energy_j is not None and before.get("energy_joules") is not None:
            energy = self.energy_j + float(before["energy_joules"])
        return {
            "tokens": tokens,
            "energy_joules": energy,
            "joules_per_token": energy / tokens if energy is not None and tokens else None,
            "continued": True,
        }


def origins_up_to(origins: list | None, chars: int) -> list[list]:
    """The origin runs of a reply's first `chars` characters ([[n, origin], ...]); all the target's
    when the runs were not kept."""
    if not origins or sum(int(n) for n, _o in origins) < chars:
        return [[chars, p.TARGET]] if chars else []
    runs, left = [], chars
    for n, origin in origins:
        if left <= 0:
            break
        runs.append([min(int(n), left), origin])
        left -= int(n)
    return runs


def footer_text(stats: dict | None) -> str:
    """The line under a message: tokens, speed, time to first token, acceptance, energy."""
    if not stats:
        return ""
    parts = [f"{stats.get('tokens', 0)} tokens"]
    if stats.get("decode_tokens_per_second"):
        parts.append(f"{stats['decode_tokens_per_second']:.1f} tok/s")
    if stats.get("ttft_seconds") is not None:
        parts.append(f"first token {stats['ttft_seconds']:.2f} s")
    if stats.get("prefill_tokens_per_second"):
        parts.append(f"prefill {stats['prefill_tokens_per_second']:.0f} tok/s")
    if stats.get("reused_tokens") is not None and stats.get("prompt_tokens"):
        parts.append(f"reused {stats['reused_tokens']} of {stats['prompt_tokens']} prompt tokens")
    limit, asked = stats.get("max_tokens"), stats.get("requested_max_tokens")
    if limit and asked and limit < asked:
        parts.append(f"limit {limit} tokens (capped by the context)")
    if stats.get("mean_acceptance_length") is not None:
        parts.append(f"τ {stats['mean_acceptance_length']:.2f}{_methods_note(stats.get('methods') or {})}")
    parts.append(
        f"{stats['joules_per_token']:.2f} J/token" if stats.get("joules_per_token") is not None else "J/token n/a"
    )
    return " · ".join(parts)


def _methods_note(methods: dict) -> str:
    """Which draft model drafted: " (MTP)", or with two each one's τ: " (DFlash 3.10, MTP 1.80)"."""
    if len(methods) == 1:
        return f" ({METHOD_NAMES.get(next(iter(methods)), next(iter(methods)))})"
    taus = [
        f"{METHOD_NAMES.get(name, name)} {figures['mean_acceptance_length']:.2f}"
        for name, figures in methods.items()
        if figures.get("mean_acceptance_length") is not None
    ]
    return f" ({', '.join(taus)})" if taus else ""


def context_note(stats: dict | None) -> str:
    """What the engine did to fit the conversation, said in the conversation; "" when nothing."""
    dropped = (stats or {}).get("dropped_messages") or 0
    cut = (stats or {}).get("cut_chars") or 0
    notes = []
    if dropped:
        what = "message was" if dropped == 1 else f"{dropped} oldest messages were"
        notes.append(
            f"{'The oldest ' if dropped == 1 else ''}{what} left out of the prompt to fit the context "
            "(the system prompt was kept, and this conversation keeps every message)."
        )
    if cut:
        notes.append(
            f"To go on, the first {cut:,} characters of this reply were left out of the prompt; the model "
            "wrote on from the rest (the reply keeps all of its text)."
        )
    return " ".join(notes)


def context_filled(stats: dict | None) -> bool:
    """The reply stopped because the context was full (not at its own end or the max tokens asked)."""
    return (stats or {}).get("finish_reason") == "context"
