"""A reader of the Prometheus text exposition format, the language of a server's `/metrics`.

Why our own: the app reads a handful of counters from vLLM, SGLang or `flashdesk serve` about once a
second, and the format is small (one sample a line: `name{label="value",...} value [timestamp]`,
`#` comments). prometheus_client's parser would be a dependency for this alone. A line this reader
does not understand is skipped and counted, never fatal: one odd metric must not hide the others.

Handled: HELP/TYPE and other comments, blanks between the tokens, label values with the escapes
`\\\\`, `\\"` and `\\n`, commas and braces inside quoted values, a trailing comma in the label
set, NaN and +Inf/-Inf values, timestamps, OpenMetrics' `# EOF` and exemplars
(`... # {trace_id="..."} 1.0`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class ParseError(ValueError):
    """A sample line that is not in the exposition format."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Metrics:
    """The samples of one scrape, by metric name; `skipped` counts the lines that could not be read."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # from # TYPE lines: counter, gauge, ...
    skipped: int = 0

    def names(self) -> list[str]:
        return list(self.samples)

    def has_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.samples)

    def get(self, name: str, **labels: str) -> list[Sample]:
        """The samples of `name` whose labels include all of `labels`."""
        return [s for s in self.samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of the matching samples (over engines, ranks, models); None when there is none."""
        found = self.get(name, **labels)
        return sum(s.value for s in found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Sums of `name` per value of `label` (e.g. per draft position), other labels summed over."""
        sums: dict[str, float] = {}
        for s in self.samples.get(name, []):
            if label in s.labels:
                sums[s.labels[label]] = sums.get(s.labels[label], 0.0) + s.value
        return sums


def parse(text: str) -> Metrics:
    """Every sample of an exposition text."""
    metrics = Metrics()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                metrics.types[parts[2]] = parts[3].strip()
            if line == "# EOF":
                break
            continue
        try:
            sample = parse_line(line)
        except ParseError:
            metrics.skipped += 1
            continue
        metrics.samples.setdefault(sample.name, []).append(sample)
    return metrics


def parse_line(line: str) -> Sample:
    """One sample line: `name{labels} value [timestamp] [# exemplar]`."""
    match = _NAME.match(line)
    if not match:
        raise ParseError(f"no metric name: {line[:80]!r}")
    name, pos = match.group(), match.end()
    labels: dict[str, str] = {}
    brace = _skip_blanks(line, pos)
    if brace < len(line) and line[brace] == "{":
        labels, pos = _labels(line, brace + 1)
    rest = line[pos:]
    if rest and not rest[0].isspace():
        raise ParseError(f"no space before the value: {line[:80]!r}")
    fields = rest.split(" # ", 1)[0].split()
    if not fields or len(fields) > 2:
        raise ParseError(f"expected a value and maybe a timestamp: {line[:80]!r}")
    try:
        value = float(fields[0])
    except ValueError as exc:
        raise ParseError(f"not a number: {fields[0]!r}") from exc
    return Sample(name, labels, value)


def _labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """The label set from just after `{`; returns it and the position after `}`."""
    labels: dict[str, str] = {}
    while True:
        pos = _skip_blanks(line, pos)
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            raise ParseError(f"bad label name at {pos}: {line[:80]!r}")
        key, pos = match.group(), _skip_blanks(line, match.end())
        if line[pos : pos + 1] != "=":
            raise ParseError(f"expected = after label {key!r}: {line[:80]!r}")
        pos = _skip_blanks(line, pos + 1)
        if line[pos : pos + 1] != '"':
            raise ParseError(f"expected a quoted value for label {key!r}: {line[:80]!r}")
        value, pos = _quoted(line, pos + 1)
        labels[key] = value
        pos = _skip_blanks(line, pos)
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise ParseError(f"expected , or }} after label {key!r}: {line[:80]!r}")


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _quoted(line: str, pos: int) -> tuple[str, int]:
    """A label value from just after its opening quote; returns it and the position after the closing one."""
    out: list[str] = []
    while pos < len(line):
        ch = line[pos]
        if ch == '"':
            return "".join(out), pos + 1
        if ch == "\\" and pos + 1 < len(line):
            nxt = line[pos + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            pos += 2
            continue
        out.append(ch)
        pos += 1
    raise ParseError(f"unterminated label value: {line[:80]!r}")
