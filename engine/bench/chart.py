"""The bench's PNG chart: speedup over AR by task type, one bar per DFlash mode."""

from __future__ import annotations

from pathlib import Path

from flashdesk.engine.bench.prompts import AUTO


def write_chart(report: dict, path: Path) -> None:
    """Grouped bars: speedup over AR by task type (and over all), one bar per DFlash mode, a line at
    1.0 (AR). matplotlib is imported here only, and drawn off screen (Agg), never through pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modes = [m for m in report["modes"] if m["draft_length"] != 0]
    groups = list(report["tasks"]) + ["all"]
    fig = Figure(figsize=(min(16.0, max(8.0, 1.5 + 0.4 * len(groups) * max(1, len(modes)))), 5.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(modes))
    fixed = [m for m in modes if m["draft_length"] != AUTO]
    for j, m in enumerate(modes):
        values = [
            (m["by_task"].get(g, {}).get("speedup_over_ar") if g != "all" else m["speedup_over_ar"]) or 0.0
            for g in groups
        ]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        color: str | tuple[float, float, float]  # a named colour, or RGB
        if m["draft_length"] == AUTO:
            color = "#d95f02"
        else:
            shade = fixed.index(m) / max(1, len(fixed) - 1) if len(fixed) > 1 else 0.5
            color = (0.35 - 0.25 * shade, 0.55 - 0.25 * shade, 0.85 - 0.25 * shade)
        bars = ax.bar(xs, values, width * 0.95, label=m["mode"], color=color)
        if len(modes) * len(groups) <= 40:
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="AR (1.0)")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("decode speedup over AR")
    ax.set_ylim(
        0,
        max(
            [1.2]
            + [1.15 * (m["speedup_over_ar"] or 0) for m in modes]
            + [1.15 * (c.get("speedup_over_ar") or 0) for m in modes for c in m["by_task"].values()]
        ),
    )
    ax.legend(fontsize=8, ncol=min(len(modes) + 1, 6), loc="upper left")
    ax.set_title(
        f"FlashDesk bench: {report['model_name']} + {report['draft_name']}\n"
        f"{report['device_name']} ({report['driver']}), "
        f"{report['prompts']} prompts x up to {report['max_new_tokens']} tokens, {report['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
