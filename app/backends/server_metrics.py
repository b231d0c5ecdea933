"""Speculation and throughput figures from a server's Prometheus `/metrics`: vLLM, SGLang, FlashDesk.

Why from /metrics: an OpenAI-compatible stream says nothing about drafts; the servers count them
in their metrics. Each scrape becomes a `Snapshot` of the counters we use; the figures of a span of
time (a reply, or the last second) are the differences between two snapshots, in the keys of the
engine's own statistics (engine/decode/stats.py's summary: drafted, accepted, acceptance_rate,
mean_acceptance_length, per_position_acceptance), so the panels read them like a local reply's.
The counters are the server's, for all its requests: with other users on it, a reply's figures
include their traffic.

The names, as the servers publish them (read in their sources: vLLM at commit 016a858, SGLang at
commit 00ae9c1; the FlashDesk names are fixed by issue 12):
- vLLM (vllm/v1/spec_decode/metrics.py, `SpecDecodingProm`; prometheus_client adds `_total` to each
  counter's samples): `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
  `vllm:spec_decode_num_accepted_tokens_total`, `vllm:spec_decode_num_accepted_tokens_per_pos_total`
  with a `position` label (0-based); mean acceptance length = 1 + accepted / drafts (the bonus token
  counted, as vLLM's own log line), per-position acceptance = accepted at the position / drafts.
  They exist only when the server speculates. Output tokens: `vllm:generation_tokens_total`.
  Several engines (data parallel) publish one sample each (an `engine` label): they are summed.
- SGLang (python/sglang/srt/metrics/collector.py, `SchedulerMetricsCollector`): gauges
  `sglang:spec_accept_length` (the average acceptance length, bonus token included) and
  `sglang:spec_accept_rate` (accepted / drafted tokens), each over SGLang's last logging interval
  (every `--decode-log-interval` decode steps, 40 by default), one sample per rank; 0 when it does
  not speculate. No draft counts, no positions. Output tokens: `sglang:generation_tokens_total`.
- FlashDesk (`flashdesk serve`): counters `flashdesk_spec_steps_total`,
  `flashdesk_spec_draft_tokens_total`, `flashdesk_spec_accepted_tokens_total`,
  `flashdesk_spec_emitted_tokens_total` (tokens of speculative steps: accepted + the target's),
  `flashdesk_generation_tokens_total`, `flashdesk_prompt_tokens_total`, `flashdesk_requests_total`;
  mean acceptance length = emitted / steps, as the engine's own summary.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashdesk.app.backends.prom_metrics import Metrics

VLLM, SGLANG, FLASHDESK = "vllm", "sglang", "flashdesk"
SERVER_NAMES = {VLLM: "vLLM", SGLANG: "SGLang", FLASHDESK: "FlashDesk"}


@dataclass(frozen=True)
class Snapshot:
    """The counters of one scrape that the app uses (None: the server does not publish it)."""

    time: float  # time.monotonic() of the scrape
    server: str | None  # VLLM, SGLANG, FLASHDESK, or None (metrics of another kind)
    generation_tokens: float | None = None
    drafts: float | None = None  # speculative steps (vLLM: drafts; FlashDesk: spec steps)
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    emitted_tokens: float | None = None  # FlashDesk: tokens of speculative steps
    accepted_per_position: tuple[float, ...] = ()  # vLLM: index 0 is the first draft position
    accept_length: float | None = None  # SGLang's gauge (already a mean)
    accept_rate: float | None = None  # SGLang's gauge

    @property
    def speculates(self) -> bool:
        """The server publishes speculation figures (and, for SGLang, has drafted)."""
        if self.server == SGLANG:
            return bool(self.accept_length)
        return self.drafts is not None


def server_kind(metrics: Metrics) -> str | None:
    for kind, prefix in ((VLLM, "vllm:"), (SGLANG, "sglang:"), (FLASHDESK, "flashdesk_")):
        if metrics.has_prefix(prefix):
            return kind
    return None


def _counter(metrics: Metrics, name: str) -> float | None:
    """A counter summed over its samples, by its exposed name (`_total`) or its bare one."""
    value = metrics.total(name + "_total")
    return value if value is not None else metrics.total(name)


def _mean_positive(metrics: Metrics, name: str) -> float | None:
    """The mean of a per-rank gauge over the ranks that report a value (0: that rank has none)."""
    values = [s.value for s in metrics.get(name) if s.value > 0]
    return sum(values) / len(values) if values else None


def read_vllm(metrics: Metrics, now: float) -> Snapshot:
    per_pos = metrics.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") or metrics.by_label(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "position"
    )
    positions = sorted((int(k), v) for k, v in per_pos.items() if k.isdigit())
    return Snapshot(
        now,
        VLLM,
        generation_tokens=_counter(metrics, "vllm:generation_tokens"),
        drafts=_counter(metrics, "vllm:spec_decode_num_drafts"),
        draft_tokens=_counter(metrics, "vllm:spec_decode_num_draft_tokens"),
        accepted_tokens=_counter(metrics, "vllm:spec_decode_num_accepted_tokens"),
        accepted_per_position=tuple(v for _, v in positions),
    )


def read_sglang(metrics: Metrics, now: float) -> Snapshot:
    return Snapshot(
        now,
        SGLANG,
        generation_tokens=_counter(metrics, "sglang:generation_tokens"),
        accept_length=_mean_positive(metrics, "sglang:spec_accept_length"),
        accept_rate=_mean_positive(metrics, "sglang:spec_accept_rate"),
    )


def read_flashdesk(metrics: Metrics, now: float) -> Snapshot:
    return Snapshot(
        now,
        FLASHDESK,
        generation_tokens=_counter(metrics, "flashdesk_generation_tokens"),
        drafts=_counter(metrics, "flashdesk_spec_steps"),
        draft_tokens=_counter(metrics, "flashdesk_spec_draft_tokens"),
        accepted_tokens=_counter(metrics, "flashdesk_spec_accepted_tokens"),
        emitted_tokens=_counter(metrics, "flashdesk_spec_emitted_tokens"),
    )


def read_snapshot(metrics: Metrics, now: float) -> Snapshot:
    """The snapshot of a scrape, read as the server that published it."""
    kind = server_kind(metrics)
    reader = {VLLM: read_vllm, SGLANG: read_sglang, FLASHDESK: read_flashdesk}.get(kind)
    return reader(metrics, now) if reader else Snapshot(now, None)


def _delta(before: float | None, after: float | None) -> float | None:
    """after - before for a counter; a counter that went down was reset (server restart): after."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def spec_between(before: Snapshot | None, after: Snapshot) -> dict | None:
    """The speculation figures from `before` to `after`, in the engine summary's keys; None when the
    server publishes none. A ratio is None (n/a) when nothing was drafted in between."""
    if not after.speculates:
        return None
    if after.server == SGLANG:
        if before is not None and before.server == SGLANG and before.generation_tokens == after.generation_tokens:
            return _nothing_drafted(SGLANG)  # its gauges still speak of the requests before
        return {
            "source": SGLANG,
            "drafted": None,
            "accepted": None,
            "acceptance_rate": after.accept_rate,
            "mean_acceptance_length": after.accept_length,
            "per_position_acceptance": [],
            "accepted_histogram": [],
        }
    base = before if before is not None and before.server == after.server else None
    drafts = _delta(base and base.drafts, after.drafts) or 0
    drafted = _delta(base and base.draft_tokens, after.draft_tokens) or 0
    accepted = _delta(base and base.accepted_tokens, after.accepted_tokens) or 0
    if after.server == FLASHDESK:
        emitted = _delta(base and base.emitted_tokens, after.emitted_tokens)
        tau = emitted / drafts if drafts and emitted is not None else None
        per_position: list[float] = []
    else:
        tau = 1 + accepted / drafts if drafts else None
        earlier = base.accepted_per_position if base else ()
        per_position = (
            [
                _delta(earlier[i] if i < len(earlier) else None, value) / drafts
                for i, value in enumerate(after.accepted_per_position)
            ]
            if drafts
            else []
        )
    return {
        "source": after.server,
        "speculative_steps": int(drafts),
        "drafted": int(drafted),
        "accepted": int(accepted),
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": tau,
        "per_position_acceptance": per_position,
        "accepted_histogram": [],
    }


def _nothing_drafted(server: str) -> dict:
    return {
        "source": server,
        "drafted": None,
        "accepted": None,
        "acceptance_rate": None,
        "mean_acceptance_length": None,
        "per_position_acceptance": [],
        "accepted_histogram": [],
    }


def tokens_per_second(before: Snapshot | None, after: Snapshot) -> float | None:
    """The server's output tokens per second between two scrapes (all its requests)."""
    if before is None or after.generation_tokens is None or after.time <= before.time:
        return None
    made = _delta(before.generation_tokens, after.generation_tokens)
    return made / (after.time - before.time) if made is not None else None
