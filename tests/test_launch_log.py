"""kernels/launch_log.py: what a run launches is what kernels.check compiles.

Two runs are recorded under the interpreter. The engine at the real shapes (kernels not executed)
must launch only specializations kernels.check's hand-written specs list. The first section of
packaging/gpu_check.py (the tiny model in fp32 and in bf16, the first thing a lent GPU runs) is
compiled for the H200 (sm_90) with Triton's own ptxas, so a compile error cannot cost the lent
minutes. The interpreter passes DOT_FP32=True where a GPU may not: the compile and the comparison
with the specs both take the GPU's value (launch_log.as_on_gpu).
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
    assert launch["signature"] == {"x_ptr": "*bf16", "scale_ptr": "*fp8e4nv", "n": "i32", "eps": "fp32", "flag": "i64"}
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
        result = gpu_check.section_tiny_correctness(
            torch.device("cpu"), smoke=True, new_tokens=8
        )  # same launches as 24
    assert result["ok"], result
    functions = {launch["function"] for launch in launches}
    assert {
        "_linear_kernel",
        "_experts_kernel",
        "_decode_split_kernel",
        "_prefill_kernel",
        "_head_norms_kernel",
        "_router_kernel",
        "_embed_norm_kernel",
        "_qkv_heads_kernel",
        "_o_proj_norms_kernel",
    } <= functions
    save(launches, tmp_path / "launches.json")
    monkeypatch.setenv(LOG_VARIABLE, str(tmp_path / "launches.json"))
    assert len(compile_specs()) == len(launches)
    rows = check(("sm_90",), modules=("flashdesk.kernels.launch_log",), workers=2)
    assert len(rows) == len(launches)
    assert any(not spec.constexprs.get("DOT_FP32", True) for spec in compile_specs())  # bf16 as on a GPU
    # fp32 tiles sized for bf16 may spill (slow, still correct): only a compile error fails here
    failed = [
        f"{row['kernel']}: {row['error']}"
        for row in rows
        if not row["ok"] and not (row["error"] or "").startswith("local memory")
    ]
    assert not failed, "\n".join(failed)


def test_every_launch_at_the_real_shapes_is_one_kernels_check_compiles():
    """kernels.check compiles hand-written specs of the real shapes; here the engine itself runs at
    those shapes (2 of the 30 layers: one sliding, one full; fp8 KV; bf16 and int4 drafters, and
    Gemma 4's MTP assistant) with
    the kernels recorded but not executed, and every launch must be among those specs, launch
    options included. It found the drafter's fc listed over 5 target layers instead of 6, its
    block's K/V write missing, and launches running 3 pipeline stages where 2 were compiled."""
    pytest.importorskip("triton")
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.bench.synthetic_model import synthetic_assistant, synthetic_drafter, synthetic_target
    from flashdesk.engine.decode.mtp import MtpDrafter
    from flashdesk.engine.decode.speculative import Decoder, SpecControl
    from flashdesk.engine.cli.bench_synthetic import run_synthetic
    from flashdesk.kernels.launch_log import unlisted

    with kernels("triton"), record_launches(execute=False) as launches:
        # prefill 1024 and 8192, AR and verify 1..16 at 8K context, a draft block of 15 (bf16 and int4)
        run_synthetic(
            layers=2, context=8192, device="cpu", dtype="bfloat16", kv_dtype="fp8", repeats=1, log=lambda message: None
        )
        # the decode loop: chunked prefill, AR steps, drafts of 1..15, context K/V from a few rows
        model = synthetic_target(2, "cpu", torch.bfloat16)
        for quantize in (None, "int4"):
            drafter = synthetic_drafter(model, quantize=quantize)
            decoder = Decoder(model, drafter, 2048, "fp8", SamplingParams(), set())
            decoder.prefill(list(range(5, 1105)))
            for control in (SpecControl(False), SpecControl(True, 1), SpecControl(True, 7), SpecControl(True, 15)):
                decoder.step(100, control)
        # Gemma 4's MTP assistant: rounds of 1..15 steps over the target's fp8 cache, in place
        mtp = MtpDrafter(model, synthetic_assistant(model))
        decoder = Decoder(model, None, 2048, "fp8", SamplingParams(), set(), mtp=mtp)
        decoder.prefill(list(range(5, 1105)))
        for control in (SpecControl(False), SpecControl(True, 1), SpecControl(True, 4), SpecControl(True, 15)):
            decoder.step(100, control)
    assert len(launches) > 40
    missing = unlisted(launches)
    assert not missing, "launched but never compiled by kernels.check:\n" + "\n".join(map(str, missing))


def test_a_layer_at_the_real_shapes_runs_6_kernels_a_decode_step_and_8_a_verify_block():
    """Kernel count is latency at batch 1 (docs/performance-model.md; ~600 kernels a step is the main
    loss of today's engines). A sliding layer of the real model on the Triton path, in a cache of
    4,096 positions (several attention splits), for a decode step and a 16-token verify: the qkv
    projection and its q/k/v norms + RoPE + the K/V write into the cache (one kernel for a decode
    step), attention with its combine, o_proj and the norms after attention (one kernel for a
    decode step), the router's projection + routing + pair grouping, the experts' one launch of
    gate/up then down items (which also runs the dense MLP, its intermediate as three experts'), the
    norms after the MLPs (which sum the experts' outputs and the dense MLP's parts); no torch op
    computes (it was 77 kernels, 50 of them torch ops)."""
    pytest.importorskip("triton")
    from flashdesk.engine.bench.synthetic_model import synthetic_target
    from flashdesk.kernels.launch_log import count_kernels

    per_step = {}
    for layers in (2, 3):  # sliding layers before a full one: the difference is one sliding layer
        model = synthetic_target(layers, "cpu", torch.bfloat16, vocab_size=1024)  # the head is not counted
        cache = model.new_cache(4096, "fp8")
        with kernels("triton"), record_launches(execute=False):
            model.forward(torch.arange(1500) % 1000, cache)
        for m in (1, 16):
            with kernels("triton"), count_kernels() as counts:
                model.compute(torch.arange(5, 5 + m), cache, logits_rows="all")
            per_step[layers, m] = counts
    for m in (1, 16):
        sliding = per_step[3, m] - per_step[2, m]
        assert sum(sliding.values()) == (6 if m == 1 else 8), dict(sliding)
        kinds = ("_decode_split_kernel", "_router_kernel", "_experts_kernel", "_mlp_out_kernel")
        assert tuple(sliding[kind] for kind in kinds) == (1, 1, 1, 1), dict(sliding)
        # a decode step's projections run the norms after them in their last programs; a block's apart
        fused = {"_qkv_heads_kernel": 1, "_o_proj_norms_kernel": 1}
        apart = {"_linear_kernel": 2, "_head_norms_kernel": 1, "_attention_out_kernel": 1}
        assert all(sliding[kind] == n for kind, n in (fused if m == 1 else apart).items()), dict(sliding)
        assert not any(name.startswith("aten.") or name == "_decode_combine_kernel" for name in sliding)


def test_what_triton_compiles_at_load_fits_every_card(tmp_path, monkeypatch):
    """The specializations Triton's real JIT compiles when the engine loads at the real shapes and
    for gpu_check's synthetic bench (recorded through a stand-in driver: launch_log.record_compiles),
    with the attributes its binder adds, compile for the four cards without a spill and within each
    card's shared memory. Those attributes let the compiler pipeline loads: the hand-written specs
    missed that the full layers' prefill attention took 149 KB of shared memory, more than an RTX
    card's block may have, and that ptxas held five kernels to fewer registers than they need and
    spilled."""
    pytest.importorskip("triton")
    import json
    import os
    import subprocess
    import sys

    from flashdesk.kernels.check import check

    log = tmp_path / "compiles.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "record_jit_compiles.py"), str(log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    launches = json.loads(log.read_text())
    assert len(launches) > 40
    assert all(launch["attrs"] for launch in launches)  # 16-byte aligned pointers at least
    for launch in launches:  # no row count, length or cache capacity is specialized (kernels/backend.py):
        specialized = set(launch["attrs"]) | set(launch["constexprs"])  # none marked divisible, none made 1
        assert not {"R", "T", "M", "S", "P", "SLOTS", "capacity"} & specialized, launch
    _hand_specs_mark_what_the_jit_marks(launches)
    monkeypatch.setenv(LOG_VARIABLE, str(log))
    rows = check(("sm_86", "sm_89", "sm_90", "sm_120"), modules=("flashdesk.kernels.launch_log",), workers=2)
    assert len(rows) == 4 * len(launches)
    failed = [f"{row['arch']} {row['kernel']}: {row['error']}" for row in rows if not row["ok"]]
    assert not failed, "\n".join(failed)


def _hand_specs_mark_what_the_jit_marks(launches: list[dict]) -> None:
    """The hand-written specs (what the performance model reads) compile with the JIT's marks: a
    spec without D's divisibility compiled the norm chains to scalar loads, 2.5x the instructions."""
    import importlib

    from flashdesk.kernels.backend import spec_key
    from flashdesk.kernels.check import SPEC_MODULES, _specs, jit_attrs
    from flashdesk.kernels.launch_log import as_on_gpu

    specs = {
        spec_key(spec.fn, spec.signature, spec.constexprs, spec.num_warps, spec.num_stages, spec.maxnreg): spec
        for module in SPEC_MODULES
        for spec in _specs(module)
    }
    compared = set()
    for launch in launches:
        fn = getattr(importlib.import_module(launch["module"]), launch["function"])
        key = spec_key(
            fn, launch["signature"], as_on_gpu(launch), launch["num_warps"], launch["num_stages"], launch.get("maxnreg")
        )
        if key in specs:
            compared.add(launch["function"])
            assert jit_attrs(specs[key]) == launch["attrs"], (specs[key].name, launch["attrs"])
    # the norm chains (an integer width), the linears and projections (an integer N), the router
    assert {"_attention_out_kernel", "_mlp_out_kernel", "_linear_kernel", "_qkv_heads_kernel", "_router_kernel"} <= (
        compared
    ), compared
