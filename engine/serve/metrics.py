"""The server's Prometheus metrics, written in the text exposition format (version 0.0.4) by hand.

Why our own: a handful of counters, two gauges and two histograms do not need prometheus_client,
and the names are a contract: the app's remote-engine panels (and any Prometheus) read them. They
count the chat completions that reached the engine queue (validation failures never do), updated
at every engine step, so a scrape during a long reply already sees its tokens.

The speculation counters have one sample per draft model, labelled by the method that drafted:
`method="dflash"` (a DFlash drafter) or `method="mtp"` (Gemma 4's MTP assistant), each loaded
method's from the start (at 0). The names are unchanged, so a reader that sums a counter's samples
(as Prometheus' sum() and the app do) still gets the server's totals. A server without a draft model
publishes these families with no samples: it never speculates.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Iterable

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

COUNTERS = {
    "flashdesk_requests_total": "Chat completion requests that reached the engine and ended (any way)",
    "flashdesk_prompt_tokens_total": "Prompt tokens of the requests run, the reused prefix included",
    "flashdesk_generation_tokens_total": "Tokens generated",
    "flashdesk_cached_prompt_tokens_total": "Prompt tokens taken from the prefix cache instead of prefilled",
    "flashdesk_spec_steps_total": "Verify passes that checked a draft (speculative steps), by the method that drafted",
    "flashdesk_spec_draft_tokens_total": (
        "Tokens drafted, by method: dflash (a DFlash drafter) or mtp (Gemma 4's MTP assistant)"
    ),
    "flashdesk_spec_accepted_tokens_total": "Drafted tokens the target accepted, by the method that drafted them",
    "flashdesk_spec_emitted_tokens_total": (
        "Tokens emitted by speculative steps (accepted drafts plus the target's own), by the method that drafted"
    ),
}
SPEC_COUNTERS = (  # labelled by method
    "flashdesk_spec_steps_total",
    "flashdesk_spec_draft_tokens_total",
    "flashdesk_spec_accepted_tokens_total",
    "flashdesk_spec_emitted_tokens_total",
)
UNNAMED = "unknown"  # the label of a draft whose step named no method
GAUGES = {
    "flashdesk_requests_running": "Requests on the engine now (0 or 1: one at a time)",
    "flashdesk_requests_waiting": "Requests queued for the engine",
}


def _label(value: str) -> str:
    """A label value as the text format escapes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _float(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus histograms are exposed."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{_float(bound)}"}} {running}')
        return out + [f"{name}_sum {_float(self.sum)}", f"{name}_count {running}"]


class ServeMetrics:
    """Thread-safe: the engine thread records, the HTTP thread exposes."""

    def __init__(self, methods: Iterable[str] = ()) -> None:
        """`methods`: the loaded draft models' methods, published at 0 before they draft."""
        self._lock = threading.Lock()
        self.counters = dict.fromkeys(COUNTERS, 0)  # the speculation ones: summed over methods
        self.by_method: dict[str, dict[str, int]] = {m: dict.fromkeys(SPEC_COUNTERS, 0) for m in methods}
        self.gauges = dict.fromkeys(GAUGES, 0)
        self.step_seconds = Histogram(STEP_BUCKETS)
        self.first_token_seconds = Histogram(FIRST_TOKEN_BUCKETS)

    def add(self, **amounts: int) -> None:
        """Add to counters by their short names: add(requests=1) adds to flashdesk_requests_total."""
        with self._lock:
            for short, amount in amounts.items():
                self.counters[f"flashdesk_{short}_total"] += amount

    def move(self, waiting: int = 0, running: int = 0) -> None:
        with self._lock:
            self.gauges["flashdesk_requests_waiting"] += waiting
            self.gauges["flashdesk_requests_running"] += running

    def step(self, seconds: float, emitted: int, drafted: int, accepted: int, method: str | None = None) -> None:
        """One decode step (drafted 0: it did not speculate), its draft made by `method`."""
        with self._lock:
            self.step_seconds.observe(seconds)
            self.counters["flashdesk_generation_tokens_total"] += emitted
            if drafted:
                amounts = zip(SPEC_COUNTERS, (1, drafted, accepted, emitted))
                own = self.by_method.setdefault(method or UNNAMED, dict.fromkeys(SPEC_COUNTERS, 0))
                for name, amount in amounts:
                    self.counters[name] += amount
                    own[name] += amount

    def first_token(self, seconds: float, emitted: int) -> None:
        """The prefill's token, `seconds` after the request arrived (its wait in the queue included)."""
        with self._lock:
            self.first_token_seconds.observe(seconds)
            self.counters["flashdesk_generation_tokens_total"] += emitted

    def exposition(self) -> str:
        with self._lock:
            lines = []
            for table, kind in ((COUNTERS, "counter"), (GAUGES, "gauge")):
                values = self.counters if kind == "counter" else self.gauges
                for name, text in table.items():
                    lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                    if name in SPEC_COUNTERS:
                        for method, own in sorted(self.by_method.items()):
                            lines.append(f'{name}{{method="{_label(method)}"}} {own[name]}')
                    else:
                        lines.append(f"{name} {values[name]}")
            for name, text, histogram in (
                ("flashdesk_step_seconds", "Engine decode step times (draft and verify)", self.step_seconds),
                (
                    "flashdesk_time_to_first_token_seconds",
                    "From a request's arrival (queue wait included) to its first token",
                    self.first_token_seconds,
                ),
            ):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} histogram", *histogram.lines(name)]
        return "\n".join(lines) + "\n"
