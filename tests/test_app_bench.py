"""The Benchmark page (app/pages/bench_page.py) against the real worker running the demo pair (offscreen):
a run with its progress, the chart and the table, the run kept and listed, "Use the best" setting the
chat's draft length; Cancel; and what it says when nothing can run."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction

from flashdesk import protocol as p
from test_app_window import demo, open_window, send, wait_idle  # noqa: F401 - fixtures and helpers
from test_telemetry import until

RUN_MS = 180_000


def choose(page, tasks: set[str], lengths: set, per_task: int, tokens: int) -> None:
    for task, box in page.task_boxes.items():
        box.setChecked(task in tasks)
    for k, box in page.length_boxes.items():
        box.setChecked(k in lengths)
    page.per_task.setValue(per_task)
    page.max_tokens.setValue(tokens)


def open_bench(window):
    window.findChild(QAction, "benchAction").trigger()
    assert window.pages.currentIndex() == 2 and window.windowTitle().startswith("Benchmark")
    return window.bench


def test_a_run_shows_progress_chart_table_is_kept_and_sets_the_best(qtbot, open_window, demo, tmp_path) -> None:
    w = open_window(demo=demo)
    page = open_bench(w)
    until(lambda: page.history.count() == 1)
    assert page.history.item(0).text() == "No runs kept yet." and not page.use_best.isEnabled()
    choose(page, {"code", "chat"}, {4, p.AUTO_DRAFT_LENGTH}, per_task=1, tokens=24)
    progress: list[p.BenchProgress] = []
    w.session.bench_progress.connect(progress.append)
    formats: list[str] = []
    w.session.bench_progress.connect(lambda _msg: formats.append(page.progress.format()))

    qtbot.mouseClick(page.run_button, Qt.MouseButton.LeftButton)
    assert page.running and not page.run_button.isEnabled() and page.cancel_button.isEnabled()
    assert page.progress.isVisible() and "2 prompt(s) in 3 modes" not in page.status.text()
    assert "1 prompt(s) in 3 modes, up to 24 new tokens each: 6 runs" in page.status.text()
    until(lambda: page.running is None, timeout_ms=RUN_MS)
    assert any(" left" in text for text in formats)  # the time left, from the run's own pace

    assert progress and progress[-1].done == progress[-1].total == 3 * 3  # (2 prompts + a warm-up) x 3 modes
    assert [m.done for m in progress] == sorted(m.done for m in progress)
    report = page.report
    assert [m["mode"] for m in report["modes"]] == ["AR", "DFlash K=4", "DFlash auto"]
    assert report["outputs_identical"] is True and report["tasks"] == ["code", "chat"]
    assert "per_prompt" not in report["modes"][0]  # no token ids over the pipe
    assert page.status.text().startswith("Done; kept in")
    assert "Outputs identical across modes: yes" in page.summary.text()
    assert page.table.rowCount() == 3 * 3  # code, chat and all tasks, each in 3 modes
    assert [page.table.item(r, 0).text() for r in (0, 3, 6)] == ["code", "chat", "all tasks"]
    assert page.table.item(6, 3).text() == "1.00×"  # AR against itself
    assert len(page.chart.items) == 2 + 1  # a series per DFlash mode and the line at 1
    assert page.chart.legend.columnCount == 2  # the legend in one row, above the bars
    kept = list((tmp_path / "data" / "bench").glob("*.json"))
    assert len(kept) == 1 and len(json.loads(kept[0].read_text())["runs"]) == 1
    assert list((tmp_path / "data" / "bench").glob("*.png"))  # the chart the CLI writes, too
    until(lambda: page.history.count() == 1 and "DFlash" in page.history.item(0).text())
    assert f"{report['model_name']} + {report['draft_name']}" in page.history.item(0).text()

    best = report["best_draft_length"]
    assert best in (4, p.AUTO_DRAFT_LENGTH)
    assert page.use_best.isEnabled()
    qtbot.mouseClick(page.use_best, Qt.MouseButton.LeftButton)
    assert report["best_mode"]["draft_length"] == best and report["best_mode"]["method"] == "dflash"
    assert w.spec.values() == (True, best, "dflash")
    assert w.store.setting("speculation") == {"enabled": True, "draft_length": best, "method": "dflash"}

    qtbot.mouseClick(page.back, Qt.MouseButton.LeftButton)
    assert w.pages.currentIndex() == 1
    send(qtbot, w, "Hello after the benchmark")  # the engine serves the chat as before
    wait_idle(qtbot, w)
    assert w.store.messages(w.controller.conversation.id)[-1].state == "complete"


def test_cancel_stops_the_run_and_keeps_nothing(qtbot, open_window, demo, tmp_path) -> None:
    w = open_window(demo=demo)
    page = open_bench(w)
    choose(page, {"code", "math", "chat"}, {4, 8, 15}, per_task=4, tokens=256)
    progress: list[p.BenchProgress] = []
    results: list[p.BenchResult] = []
    w.session.bench_progress.connect(progress.append)
    w.session.bench_result.connect(results.append)
    qtbot.mouseClick(page.run_button, Qt.MouseButton.LeftButton)
    until(lambda: progress, timeout_ms=RUN_MS)
    qtbot.mouseClick(page.cancel_button, Qt.MouseButton.LeftButton)
    until(lambda: page.running is None, timeout_ms=RUN_MS)

    assert results and results[-1].cancelled and results[-1].report is None
    assert progress[-1].done < progress[-1].total
    assert page.status.text().startswith("Cancelled") and page.run_button.isEnabled()
    assert not list((tmp_path / "data" / "bench").glob("*.json"))
    choose(page, {"code"}, {4}, per_task=1, tokens=8)  # the worker takes the next run at once
    qtbot.mouseClick(page.run_button, Qt.MouseButton.LeftButton)
    until(lambda: page.running is None, timeout_ms=RUN_MS)
    assert page.report is not None and page.status.text().startswith("Done")


def test_run_is_off_with_a_reason_until_a_pair_is_loaded(qtbot, open_window) -> None:
    w = open_window()  # a first start: no model
    page = open_bench(w)
    assert not page.run_button.isEnabled()
    assert page.status.text().startswith("Load a model with a draft model")
    assert page.run_button.toolTip() == page.status.text()


def test_the_time_left_comes_from_the_runs_pace() -> None:
    from flashdesk.app.pages.bench_page import time_left_text

    assert time_left_text(0, 10, 5.0) == "" and time_left_text(10, 10, 50.0) == ""
    assert time_left_text(1, 10, 5.0) == "under a minute left"  # 9 runs at 5 s
    assert time_left_text(2, 12, 30.0) == "about 2 minutes left" and time_left_text(1, 3, 30.0) == "about 1 minute left"


def test_bench_messages_round_trip() -> None:
    for msg in (
        p.Bench("r1", ["code"], [4, p.AUTO_DRAFT_LENGTH], 2, 64),
        p.BenchHistory("r2"),
        p.BenchProgress("r1", 3, 9, "code 1/2 | DFlash K=4"),
        p.BenchResult("r1", {"modes": []}),
        p.BenchResult("r1", None, cancelled=True),
        p.BenchRuns("r2", [{"date": "2026-11-30"}]),
        p.Survey("/data/demo"),
        p.Inspect("/m", None, 4096, "cpu"),
    ):
        assert p.decode(p.encode(msg)) == msg
    assert p.decode('{"type": "bench", "request_id": "r", "tasks": [], "draft_lengths": []}').prompts_per_task == 4
