"""`flashdesk bench`: every mode on the same prompts in one run, and --compare against the references."""

import json
from pathlib import Path

import pytest

from flashdesk.engine.cli.main import main


def test_bench_compares_modes_and_references(spec_pair, tmp_path, capsys):
    target_dir, draft_dir = spec_pair[1]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"category": "code", "prompt": "Write hello world"}\nTell me a joke\n')
    args = [
        "bench",
        "--model",
        str(target_dir),
        "--draft",
        str(draft_dir),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "12",
        "--draft-lengths",
        "2,5",
        "--compare",
    ]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [m["mode"] for m in report["modes"]] == ["AR", "DFlash K=2", "DFlash K=5"]
    assert report["categories"] == ["code", "other"]
    assert report["outputs_identical"] is True
    ar = report["modes"][0]
    assert ar["speedup_over_ar"] == 1.0 and ar["acceptance_rate"] is None
    for mode in report["modes"][1:]:
        assert mode["speedup_over_ar"] > 0 and 0 <= mode["acceptance_rate"] <= 1
        assert mode["mean_acceptance_length"] >= 1
    assert set(report["compare"]) == {"transformers_ar", "zlab_dflash_k2", "zlab_dflash_k5"}
    assert all(c["tokens_per_second"] > 0 and c["ours_over_it"] > 0 for c in report["compare"].values())

    assert main(args) == 0
    table = capsys.readouterr().out
    assert "transformers generate (AR)" in table and "z-lab dflash_generate K=5" in table
    assert table.count("ours / it =") == 3 and "outputs identical across modes: yes" in table


def test_bench_refuses_bad_input(spec_pair, tmp_path, capsys):
    target_dir, draft_dir = spec_pair[1]
    base = ["bench", "--model", str(target_dir), "--draft", str(draft_dir)]
    assert main(base + ["--draft-lengths", "0,4"]) == 2
    assert "--draft-lengths: 0 is outside 1..15 for the dflash draft model" in capsys.readouterr().err
    assert main(base + ["--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "prompts file not found" in capsys.readouterr().err


# -- by task type, on the demo pair ------------------------------------------------------------

TASKS = ["code", "math", "reasoning", "chat", "summarization", "translation", "json"]
TODAY = {
    "model",
    "draft",
    "prompts",
    "categories",
    "max_new_tokens",
    "device",
    "dtype",
    "kv_dtype",
    "modes",
    "outputs_identical",
}
TODAY_MODE = {
    "mode",
    "draft_length",
    "decode_tokens",
    "decode_seconds",
    "tokens_per_second",
    "speedup_over_ar",
    "acceptance_rate",
    "mean_acceptance_length",
    "per_prompt",
}


def test_builtin_prompt_sets():
    """Every task type has at least 16 prompts of our own, each {"prompt", "task"} (and a schema the
    library compiles, for the json task), none repeated."""
    from flashdesk.engine.decode.grammar import check, json_grammar
    from flashdesk.engine.bench.prompts import PROMPTS_DIR, TASKS as BENCH_TASKS, task_prompts

    assert list(BENCH_TASKS) == TASKS
    assert sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl")) == sorted(TASKS)
    seen = set()
    for task in TASKS:
        lines = (PROMPTS_DIR / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
        items = [json.loads(line) for line in lines if line.strip()]
        fields = {"prompt", "task", "schema"} if task == "json" else {"prompt", "task"}
        assert len(items) >= 16 and all(set(i) == fields and i["task"] == task for i in items)
        assert all(check(json_grammar(i["schema"])) == "" for i in items if "schema" in i)
        assert all(len(i["prompt"]) >= 20 for i in items) and len(task_prompts(task)) == len(items)
        assert not seen & {i["prompt"] for i in items}
        seen |= {i["prompt"] for i in items}


def test_bench_demo_by_task_json_chart_and_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    args = ["bench", "--demo", "--prompts-per-task", "1", "--max-new-tokens", "16", "--draft-lengths", "2,auto"]
    assert main(args + ["--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is exactly one JSON object
    assert "bench" in captured.err and "100%" in captured.err  # the progress bar, on stderr
    assert TODAY <= set(report) and report["outputs_identical"] is True
    assert report["prompts"] == 7 and report["categories"] == TASKS and report["tasks"] == TASKS
    assert [m["mode"] for m in report["modes"]] == ["AR", "DFlash K=2", "DFlash auto"]
    assert [m["draft_length"] for m in report["modes"]] == [0, 2, "auto"]
    for m in report["modes"]:
        assert TODAY_MODE <= set(m) and set(m["by_task"]) == set(TASKS)
        for cell in m["by_task"].values():
            assert {"tokens_per_second", "speedup_over_ar", "mean_acceptance_length"} <= set(cell)
            assert cell["tokens_per_second"] > 0 and cell["ttft_seconds"] > 0 and cell["prompts"] == 1
            assert cell["joules_per_token"] is None  # no energy counter on the CPU
    ar, k2, auto = report["modes"]
    assert ar["speedup_over_ar"] == 1.0 and all(c["speedup_over_ar"] == 1.0 for c in ar["by_task"].values())
    assert ar["mean_acceptance_length"] is None and ar["acceptance_by_position"] == []
    assert len(k2["acceptance_by_position"]) == 2 and k2["mean_acceptance_length"] >= 1
    assert all(c["speedup_over_ar"] > 0 and c["mean_draft_length"] <= 2 for c in k2["by_task"].values())
    assert auto["steps"] > 0 and auto["tokens_per_second"] > 0
    for m in report["modes"]:  # the grammar's share, on the json prompts alone
        assert 0 < m["by_task"]["json"]["grammar_share"] < 1 and 0 < m["grammar_share"] < 1
        assert all(c["grammar_share"] is None for task, c in m["by_task"].items() if task != "json")
    assert report["device_name"] and report["driver"] == "cpu" and report["energy"].startswith("n/a")

    chart = Path(report["chart"])
    assert chart.parent == tmp_path / "bench" and chart.suffix == ".png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 1000
    results = Path(report["results_file"])
    assert results.parent == tmp_path / "bench" and results.stem == report["results_key"]
    assert "demo-target" in results.stem and "demo-drafter" in results.stem
    saved = json.loads(results.read_text())
    assert saved["model"] == "demo-target" and len(saved["runs"]) == 1
    assert "per_prompt" not in saved["runs"][0]["modes"][0]  # no token ids in the kept file

    own_chart = tmp_path / "charts" / "mine.png"  # a second run: the text report, a chart of our own
    assert main(args + ["--tasks", "math,code", "--chart", str(own_chart)]) == 0
    table = capsys.readouterr().out
    assert own_chart.read_bytes()[:4] == b"\x89PNG"
    rows = [line.split() for line in table.splitlines()]
    assert ["math", "AR"] == rows[[r[:1] for r in rows].index(["math"])][:2]
    assert any(r[:2] == ["DFlash", "auto"] for r in rows) and not any(r[:1] == ["chat"] for r in rows)
    assert "outputs identical across modes: yes" in table and "(run 2)" in table
    assert max(len(line) for line in table.splitlines() if not line.startswith(("results:", "chart:"))) <= 100
    assert len(json.loads(results.read_text())["runs"]) == 2

    assert main(["bench", "--history"]) == 0
    listing = capsys.readouterr().out
    assert "demo-target + demo-drafter" in listing and listing.count("prompts x") == 2


def test_bench_by_task_refuses_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    assert main(["bench", "--demo", "--tasks", "code,poetry"]) == 2
    assert "--tasks: unknown task type 'poetry'" in capsys.readouterr().err
    assert main(["bench", "--demo", "--draft-lengths", "4,eight"]) == 2
    assert "--draft-lengths: 'eight' is not a draft length" in capsys.readouterr().err
    assert main(["bench", "--demo", "--prompts-per-task", "0"]) == 2
    assert "--prompts-per-task must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--demo", "--model", str(tmp_path)])
    assert exc.value.code == 2 and "leave out --model" in capsys.readouterr().err


def test_device_probe_reads_nvml(monkeypatch):
    """On a GPU: the name from torch, the driver and the energy counter from NVML (found by PCI bus id)."""
    import sys
    from types import SimpleNamespace

    import torch

    from flashdesk.engine.bench.device import DeviceProbe

    calls = []
    counter = iter(range(1000, 10**6, 250))

    def energy(handle):
        if handle != "h0":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return next(counter)

    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: "570.86.10",
        nvmlDeviceGetHandleByPciBusId=lambda bus: calls.append(bus) or "h0",
        nvmlDeviceGetTotalEnergyConsumption=energy,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i=0: SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0),
    )
    probe = DeviceProbe(torch.device("cuda", 0))
    assert (probe.name, probe.driver, probe.energy_note) == ("NVIDIA H200", "570.86.10", "NVML energy counter")
    assert calls == ["00000000:1B:00.0"]
    first = probe.energy_mj()
    assert probe.energy_mj() - first == 250
    probe.close()
    assert calls[-1] == "shutdown" and probe.energy_mj() is None

    fake.nvmlDeviceGetHandleByPciBusId = lambda bus: "old-gpu"  # no energy counter: n/a, not an error
    probe = DeviceProbe(torch.device("cuda", 0))
    assert probe.energy_mj() is None and probe.energy_note.startswith("n/a") and probe.driver == "570.86.10"


def test_bench_joules_per_token_and_results_key(tmp_path, monkeypatch, capsys):
    """With an energy counter (a stand-in for NVML's), each cell has J/token; the key names the GPU."""
    from flashdesk.engine.bench import measure

    class Probe:
        def __init__(self, device):
            self.name, self.driver, self.energy_note, self.mj = "NVIDIA GeForce RTX 4090", "570.86.10", "NVML", 0.0

        def energy_mj(self):
            self.mj += 40.0
            return self.mj

        def close(self):
            pass

    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(measure, "DeviceProbe", Probe)
    args = [
        "bench",
        "--demo",
        "--tasks",
        "code,chat",
        "--prompts-per-task",
        "1",
        "--max-new-tokens",
        "8",
        "--draft-lengths",
        "3",
        "--json",
        "--no-progress",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "bench:" not in captured.err  # --no-progress
    assert report["results_key"] == "nvidia-geforce-rtx-4090__570.86.10__demo-target__demo-drafter"
    for m in report["modes"]:
        assert m["energy_joules"] == pytest.approx(0.04 * 2)  # one prompt per task, 40 mJ of decode each
        assert m["joules_per_token"] == pytest.approx(m["energy_joules"] / m["decode_tokens"])
        assert all(c["joules_per_token"] > 0 for c in m["by_task"].values())


def test_bench_full_takes_every_prompt(tmp_path, monkeypatch, capsys):
    from flashdesk.engine.bench.prompts import task_prompts

    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    assert (
        main(
            [
                "bench",
                "--demo",
                "--tasks",
                "translation",
                "--full",
                "--draft-lengths",
                "2",
                "--max-new-tokens",
                "2",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["prompts"] == len(task_prompts("translation")) >= 16 and report["prompts_per_task"] is None


def _run(speeds: dict) -> dict:
    return {"modes": [{"draft_length": k, "mode": str(k), "tokens_per_second": v} for k, v in speeds.items()]}


def test_the_best_draft_length_of_a_run():
    """auto where it was at least as fast as the best fixed K (issue 10), else that K."""
    from flashdesk.engine.bench.results import best_draft_length

    assert best_draft_length(_run({0: 100.0, 4: 200.0, 8: 190.0, "auto": 210.0})) == "auto"
    assert best_draft_length(_run({0: 100.0, 4: 200.0, 8: 190.0, "auto": 200.0})) == "auto"
    assert best_draft_length(_run({0: 100.0, 4: 200.0, 8: 190.0, "auto": 199.0})) == 4
    assert best_draft_length(_run({0: 100.0, 4: 90.0, 8: 95.0})) == 8  # the best DFlash mode, even below AR
    assert best_draft_length(_run({0: 100.0})) is None


def test_the_kept_bench_sets_the_engine_default(spec_pair, tmp_path, monkeypatch, capsys):
    """A load takes the fastest mode of the newest kept bench of that pair on this card as the draft
    length of a control that names none; before any bench it drafts the longest."""
    from flashdesk.engine.bench.results import benched_default
    from flashdesk.engine.decode.generation import Engine, GenerationRequest
    from flashdesk.engine.decode.speculative import SpecControl
    from tiny_drafter import PROMPTS

    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    target, draft = (str(p) for p in spec_pair[1])
    engine = Engine.load(target, device="cpu", draft_dir=draft, draft_default=benched_default)
    assert engine.default_draft_length is None and engine.default_note == ""
    assert (
        main(
            [
                "bench",
                "--model",
                target,
                "--draft",
                draft,
                "--tasks",
                "code",
                "--prompts-per-task",
                "1",
                "--max-new-tokens",
                "8",
                "--draft-lengths",
                "3,auto",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    engine = Engine.load(target, device="cpu", draft_dir=draft, draft_default=benched_default)
    assert engine.default_draft_length == report["best_draft_length"] in (3, "auto")
    assert "fastest in the bench of" in engine.default_note

    results = Path(report["results_file"])  # a newer run where K=3 wins
    data = json.loads(results.read_text())
    data["runs"].append(_run({0: 100.0, 3: 300.0, "auto": 250.0}) | {"date": "2099-01-01T00:00:00"})
    results.write_text(json.dumps(data))
    engine = Engine.load(target, device="cpu", draft_dir=draft, draft_default=benched_default)
    assert engine.default_draft_length == 3 and engine.default_note.startswith("K=3: fastest")
    events = list(engine.generate(GenerationRequest(PROMPTS[0], 24, ignore_eos=True), SpecControl(True, None)))
    drafted = [len(e.draft) for e in events[1:-1] if e.draft]
    assert drafted and max(drafted) == 3


def test_compare_leaves_out_the_prompts_held_to_a_schema():
    """The references know no grammar, so --compare runs the prompts without a schema: by default
    the json task type is left out, and asked for by name it is refused."""
    from flashdesk.engine.cli.bench import plan_from_args
    from flashdesk.engine.cli.main import _parser

    plan = plan_from_args(_parser().parse_args(["bench", "--demo", "--compare"]))
    assert "json" not in plan.tasks and plan.items and not any(p.get("schema") for p in plan.items)
    assert "json" in plan_from_args(_parser().parse_args(["bench", "--demo"])).tasks
    with pytest.raises(ValueError, match="know no grammar"):
        plan_from_args(_parser().parse_args(["bench", "--demo", "--compare", "--tasks", "code,json"]))
