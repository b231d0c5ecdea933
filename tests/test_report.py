"""`flashdesk doctor --report` (engine/cli/report.py): one file with the machine, the kernel
self-tests, the last load and the last errors, and no prompts or replies."""

import json

from flashdesk.engine.cli import report
from flashdesk.engine.cli.main import main


def test_the_report_holds_the_machine_the_last_load_and_the_last_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path / "data"))
    report.record_load(
        {
            "model": "gemma-4-26B-A4B-it-AWQ-4bit",
            "device": "cuda:0",
            "context_limit": 262144,
            "allocated_bytes": 20 << 30,
            "planned_bytes": 21 << 30,
        }
    )
    report.log_error("out_of_memory", "generate", "CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")
    assert main(["doctor", "--report", str(tmp_path / "r.json")]) == 0
    assert f"wrote {tmp_path / 'r.json'}" in capsys.readouterr().out
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["flashdesk"] and any(line.startswith("torch: ") for line in got["environment"])
    assert got["last_load"]["context_limit"] == 262144 and got["last_load"]["planned_bytes"] == 21 << 30
    assert [(e["kind"], e["during"], e["message"]) for e in got["errors"]] == [
        ("out_of_memory", "generate", "CUDA out of memory. Tried to allocate 2.00 GiB")
    ]  # the first line only
    assert got["kernel_self_tests"] == {"device": "cpu", "note": "the Triton kernels do not run here"}
    assert main(["doctor", "--report", "-"]) == 0 and json.loads(capsys.readouterr().out)["errors"]
    assert main(["doctor", "--report"]) == 0 and list((tmp_path / "data" / "reports").glob("flashdesk-report-*.json"))


def test_the_error_log_keeps_the_last_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    for i in range(3 * report.KEEP_ERRORS):
        report.log_error("crash", "generate", f"error {i}")
    assert len((tmp_path / report.ERRORS_FILE).read_text().splitlines()) <= 2 * report.KEEP_ERRORS
    kept = report.build_report()["errors"]
    assert len(kept) == report.KEEP_ERRORS and kept[-1]["message"] == f"error {3 * report.KEEP_ERRORS - 1}"
