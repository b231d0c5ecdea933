"""The bench's text report (per task type x mode) and the history of kept runs, for the terminal."""

from __future__ import annotations

from pathlib import Path


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _row(task: str, name: str, c: dict) -> str:
    ttft = None if c.get("ttft_seconds") is None else c["ttft_seconds"] * 1000.0
    speedup = _fmt(c["speedup_over_ar"], ".2f") + ("x" if c["speedup_over_ar"] is not None else "")
    return (
        f"{task:<15}{name:<14}{c['tokens_per_second']:>9.1f}{speedup:>9}{_fmt(ttft, '.1f'):>10}"
        f"{_fmt(c['mean_acceptance_length'], '.2f'):>7}{_fmt(c['acceptance_rate'], '.0%'):>8}"
        f"{_fmt(c.get('mean_draft_length'), '.1f'):>7}{_fmt(c.get('joules_per_token'), '.3f', 'n/a'):>9}"
    )


def format_report(report: dict) -> str:
    """Per task type x mode: decode tok/s, speedup over AR, TTFT, tau, acceptance, mean K, J/token;
    then acceptance by draft position per mode (all tasks); 100 columns at most."""
    tasks = report.get("tasks") or list(dict.fromkeys(report.get("categories", [])))
    per_task = report.get("prompts_per_task")
    shape = f" ({len(tasks)} task types x {per_task})" if per_task and tasks else ""
    lines = [
        f"FlashDesk bench: {report['prompts']} prompts{shape} x up to {report['max_new_tokens']} new tokens, "
        "greedy, modes interleaved",
        f"device: {report.get('device_name', report['device'])} ({report.get('driver', '?')}), "
        f"{report['dtype']}, KV {report['kv_dtype']}; energy: {report.get('energy', 'n/a')}",
    ]
    if report.get("model_name"):
        lines.append(f"models: {report['model_name']} + {report['draft_name']}")
    lines += [
        "",
        f"{'task':<15}{'mode':<14}{'tok/s':>9}{'speedup':>9}{'TTFT ms':>10}{'tau':>7}{'accept':>8}"
        f"{'K':>7}{'J/token':>9}",
    ]
    for task in tasks:
        for j, m in enumerate(report["modes"]):
            if task in m.get("by_task", {}):
                lines.append(_row(task if j == 0 else "", m["mode"], m["by_task"][task]))
    for j, m in enumerate(report["modes"]):
        lines.append(_row("all tasks" if j == 0 else "", m["mode"], m))
    spec = [m for m in report["modes"] if m.get("acceptance_by_position")]
    if spec:
        lines += ["", "acceptance by draft position (1, 2, ...), all tasks:"]
        for m in spec:
            lines.append(f"{m['mode']:<15}" + "".join(f"{p:>5.0%}" for p in m["acceptance_by_position"][:16]))
    constrained = [m for m in report["modes"] if m.get("grammar_share") is not None]
    if constrained:
        lines += ["", "grammar masks (the prompts held to a JSON schema), share of their decode time:"]
        lines += [f"{m['mode']:<15}{m['grammar_share']:>6.1%}" for m in constrained]
    lines.append("")
    lines.append(
        "outputs identical across modes: "
        + ("yes" if report["outputs_identical"] else "NO (speculation changed the output: a bug)")
    )
    for name, c in report.get("compare", {}).items():
        label = (
            "transformers generate (AR)"
            if name == "transformers_ar"
            else f"z-lab dflash_generate K={name.removeprefix('zlab_dflash_k')}"
        )
        lines.append(f"{label:<34}{c['tokens_per_second']:>10.1f} tok/s   ours / it = {c['ours_over_it']:.2f}x")
    if report.get("results_file"):
        lines.append(f"results: {report['results_file']} (run {report['results_runs']})")
    if report.get("chart"):
        lines.append(f"chart:   {report['chart']}")
    return "\n".join(lines)


def format_history(files: list[dict], folder: Path) -> str:
    if not files:
        return f"no bench results yet in {folder}"
    lines = []
    for f in files:
        lines.append(f"{f['device']} ({f['driver']}): {f['model']} + {f['drafter']}")
        lines.append(f"  {f['file']}")
        for r in f["runs"]:
            best = f"{r['best_mode']} {r['best_speedup']:.2f}x" if r["best_mode"] else "-"
            ar = f"{r['ar_tokens_per_second']:.1f}" if r["ar_tokens_per_second"] else "-"
            lines.append(
                f"  {r['date'] or '?':<20}{r['prompts'] or 0:>4} prompts x {r['max_new_tokens'] or 0:<5}"
                f" AR {ar:>8} tok/s   best {best}"
            )
    return "\n".join(lines)
