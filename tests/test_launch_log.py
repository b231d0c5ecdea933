"""Every Triton launch of the first thing packaging/gpu_check.py runs on a lent GPU compiles for it.

kernels.check compiles the specializations the real model launches (bf16); gpu_check's first
section runs the tiny model in fp32 on the device. Recorded under the interpreter, each of its
distinct launches is compiled here for the H200 (sm_90) with Triton's own ptxas, so a compile error
cannot cost the lent minutes. The interpreter passes DOT_FP32=True where a GPU passes False; with
fp32 activations both compile to the same fp32 dot, so these are the GPU's launches.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from flashdesk.kernels.backend import kernels
from flashdesk.kernels.launch_log import LOG_VARIABLE, compile_specs, describe_launch, record_launches, save

ROOT = Path(__file__).resolve().parent.parent


def test_a_launch_is_described_by_its_argument_types_and_constexpr_values():
    def kernel(x_ptr, scale_ptr, n, eps, flag, HAS_ZERO: "tl.constexpr", BLOCK: "tl.constexpr" = 64):  # noqa: F821
        pass

    x, scale = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float8_e4m3fn)
    launch = describe_launch(kernel, (x, scale, 7, 1e-6), {"flag": 2**40, "HAS_ZERO": None, "num_warps": 8})
    assert launch["signature"] == {"x_ptr": "*bf16", "scale_ptr": "*fp8e4nv", "n": "i32", "eps": "fp32",
                                   "flag": "i64"}
    assert launch["constexprs"] == {"HAS_ZERO": None}  # BLOCK, not passed, keeps its default at compile
    assert (launch["num_warps"], launch["num_stages"]) == (8, 3)
    with pytest.raises(TypeError, match="argument n: cannot type a str"):
        describe_launch(kernel, (x, scale, "7", 1e-6, 1, True), {})


def test_gpu_checks_first_section_launches_only_kernels_that_compile_for_sm_90(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from flashdesk.kernels.check import check

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "packaging" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    with kernels("triton"), record_launches() as launches:
        result = gpu_check.section_tiny_correctness(torch.device("cpu"), smoke=True, new_tokens=24)
    assert result["ok"], result
    functions = {launch["function"] for launch in launches}
    assert {"_linear_kernel", "_gate_up_kernel", "_down_kernel", "_decode_split_kernel", "_prefill_kernel",
            "_kv_write_kernel", "_rms_norm_kernel"} <= functions
    save(launches, tmp_path / "launches.json")
    monkeypatch.setenv(LOG_VARIABLE, str(tmp_path / "launches.json"))
    assert len(compile_specs()) == len(launches)
    rows = check(("sm_90",), modules=("flashdesk.kernels.launch_log",), workers=2)
    assert len(rows) == len(launches)
    # fp32 tiles sized for bf16 may spill (slow, still correct): only a compile error fails here
    failed = [f"{row['kernel']}: {row['error']}" for row in rows
              if not row["ok"] and not (row["error"] or "").startswith("local memory")]
    assert not failed, "\n".join(failed)
