"""The prepared GPU script runs end to end (on the CPU, small shapes), so a session lent a GPU can
spend its minutes measuring instead of debugging the script."""

import json
import subprocess
import sys
from pathlib import Path

from flashdesk.kernels.backend import KERNELS

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_smoke(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "gpu_check.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    # the first load's kernel self-tests, through the interpreter here (conftest sets TRITON_INTERPRET)
    families = [kernel["name"] for kernel in results["kernel_self_tests"]["kernels"]]
    assert results["kernel_self_tests"]["ok"] is True and sorted(families) == sorted(KERNELS)  # every family
    assert results["tiny_correctness"]["ok"] is True
    assert results["tiny_correctness"]["dflash_greedy_equals_ar"] is True
    # drafts with graphs and the context written ahead against eager steps: a GPU's check (no graphs here)
    assert results["tiny_correctness"]["drafts_with_graphs_equal_eager"] == {
        "equal": True,
        "graphs": False,
        "ahead": False,
    }
    assert results["synthetic_bench"]["ok"] and results["synthetic_bench"]["model_vs_measured"] == {
        "skipped": "the model is of the real shapes on a GPU"
    }
    row = results["full_size"]["float32"]
    assert row["ar_step_ms"] > 0 and row["dflash_k15_step_ms"] > 0
    assert row["mtp_k8_step_ms"] > 0 and set(row["mtp_k4_projected_speedup_at_tau"]) == {"1", "2", "3", "4", "5"}
    # batch invariance is measured everywhere and required on a GPU only (fp32 CPU matmuls are not)
    for check in (results["tiny_correctness"]["bf16_int4_fp8_block_rows_equal_alone"], row["block_rows_equal_alone"]):
        assert isinstance(check["equal"], bool) and check["max_abs_diff"] >= 0
        assert check["equal"] == (check["max_abs_diff"] == 0)
    # the report of what the driver loaded (registers, spills) is a GPU's: on the CPU nothing compiled
    assert results["compiled_kernels"] == {
        "ok": True,
        "compiled": 0,
        "spilling": [],
        "max_registers": None,
        "max_shared_bytes": None,
        "seconds": results["compiled_kernels"]["seconds"],
    }


def test_gpu_check_keeps_what_finished_when_a_section_hangs(tmp_path):
    """A section that hangs past --deadline: the script prints the stacks and exits, and
    gpu_check.json holds the sections that finished and names the one that did not."""
    script = ROOT / "packaging" / "gpu_check.py"
    hang = (
        "import importlib.util, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('gpu_check', {str(script)!r})\n"
        "gpu_check = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpu_check)\n"
        "gpu_check.section_kernel_self_tests = lambda device, smoke: time.sleep(60)\n"
        f"sys.argv = ['gpu_check', '--smoke', '--deadline', '2', '--out', {str(tmp_path)!r}]\n"
        "sys.exit(gpu_check.main())\n"
    )
    done = subprocess.run([sys.executable, "-c", hang], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "Timeout" in done.stderr and "most recent call first" in done.stderr  # the hung stack
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["environment"]["torch"]
    assert "did not finish" in results["kernel_self_tests"]["error"]
    assert "tiny_correctness" not in results


def test_modeled_steps_are_set_beside_the_measured_ones():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "packaging" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    modeled = [
        {"step": "ar", "launches": 416, "bytes": 3 * 10**9, "floor_seconds": 0.0007, "modeled_seconds": 0.002},
        {"step": "draft", "launches": 64, "bytes": 2 * 10**9, "floor_seconds": 0.0005, "modeled_seconds": 0.001},
    ]
    measured = [
        {"name": "ar", "seconds": 0.003},
        {"name": "verify-16", "seconds": 0.006},
        {"name": "draft", "seconds": 0.004},
        {"name": "draft-int4", "seconds": 0.0015},
    ]
    rows = gpu_check.compare_steps(modeled, measured)
    assert rows == [
        {
            "step": "ar",
            "launches": 416,
            "bytes": 3 * 10**9,
            "floor_ms": 0.7,
            "modeled_ms": 2.0,
            "measured_ms": 3.0,
            "measured_over_modeled": 1.5,
        },
        # the model's draft is the default (int4) drafter's: set beside draft-int4, not the bf16 draft
        {
            "step": "draft-int4",
            "launches": 64,
            "bytes": 2 * 10**9,
            "floor_ms": 0.5,
            "modeled_ms": 1.0,
            "measured_ms": 1.5,
            "measured_over_modeled": 1.5,
        },
    ]
    measured[-1]["seconds"] = None  # a step that did not run has no time to compare
    assert [row["step"] for row in gpu_check.compare_steps(modeled, measured)] == ["ar"]
