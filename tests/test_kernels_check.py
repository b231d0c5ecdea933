"""kernels/check.py: compiling specs to cubins for several cards and reading their resource usage.

The kernels here are tiny on purpose; the check's spawned workers import this module by name
(`test_kernels_check:good_specs`) with the interpreter off, so they compile real cubins.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import json
import subprocess
import sys

import pytest
import triton
import triton.language as tl

from flashdesk.kernels import check as kcheck
from flashdesk.kernels.backend import CompileSpec
from flashdesk.kernels.grid_dependency import enter

HERE = __name__


@triton.jit
def _scale(x, y, n, factor, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 1.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y + offs, tl.load(x + offs, mask=mask) * factor + SHIFT, mask=mask)


@triton.jit
def _scale_after_wait(x, y, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * 2.0, mask=offs < n)


@triton.jit
def _spill(x, y, N: tl.constexpr):
    # One warp holding 4096 doubles: 256 registers' worth per thread, live across the sum.
    offs = tl.arange(0, N)
    values = tl.load(x + offs)
    tl.store(y + offs, values - tl.sum(values, axis=0))


def good_specs():
    # SHIFT is left to its default: the check fills it in as a launch would.
    return [
        CompileSpec(
            "tiny_scale",
            _scale,
            {"x": "*fp32", "y": "*fp32", "n": "i32", "factor": "fp32", "BLOCK": "constexpr"},
            {"BLOCK": 256},
        )
    ]


def pdl_specs():
    # PDL is left out: the check sets it by arch
    return [
        CompileSpec(
            "tiny_scale_after_wait", _scale_after_wait, {"x": "*fp32", "y": "*fp32", "n": "i32"}, {"BLOCK": 256}
        )
    ]


def spill_specs():
    return [CompileSpec("spill_fp64_w1", _spill, {"x": "*fp64", "y": "*fp64"}, {"N": 4096}, num_warps=1)]


def bad_specs():
    return [
        CompileSpec("bad_signature", _scale, {"x": "*fp32", "y": "*fp32"}, {"BLOCK": 256}),
        CompileSpec("bad_type", _scale, {"x": "*fp33", "y": "*fp32", "n": "i32", "factor": "fp32"}, {"BLOCK": 256}),
    ]


def broken_specs():
    raise RuntimeError("compile_specs blew up")


def crashing_specs():
    os._exit(3)  # only ever called in a check worker: stands in for a segfaulting compiler


@pytest.fixture(scope="module")
def rows():
    """One check run (a pool start costs seconds) over good, bad, broken and missing modules."""
    before = os.environ.get("TRITON_INTERPRET")
    modules = (
        f"{HERE}:good_specs",
        f"{HERE}:pdl_specs",
        f"{HERE}:bad_specs",
        f"{HERE}:broken_specs",
        "flashdesk.kernels.no_such_module",
    )
    result = kcheck.check(["sm_86", "sm_120"], modules=modules)
    assert os.environ.get("TRITON_INTERPRET") == before  # the workers' env did not leak
    return result


def _by_kernel(rows, kernel):
    return [r for r in rows if r["kernel"] == kernel]


def test_tiny_kernel_compiles_for_sm86_and_sm120(rows):
    tiny = _by_kernel(rows, "tiny_scale")
    assert [r["arch"] for r in tiny] == ["sm_86", "sm_120"]
    for r in tiny:
        assert r["ok"] and r["error"] is None, r
        assert r["registers"] > 0 and r["local_bytes"] == 0 and r["shared_bytes"] == 0
        assert r["seconds"] >= 0


def test_a_kernel_waits_on_the_kernels_before_it_where_the_arch_has_pdl(rows):
    """Programmatic dependent launch exists from sm_90: a kernel with a PDL argument compiles its
    wait in for sm_120 and not for sm_86 (where the instruction does not exist); the row says which
    from the PTX."""
    waits = _by_kernel(rows, "tiny_scale_after_wait")
    assert [(r["arch"], r["ok"], r["pdl"]) for r in waits] == [("sm_86", True, False), ("sm_120", True, True)]
    assert [r["pdl"] for r in _by_kernel(rows, "tiny_scale")] == [False, False]


# what a kernel may call before its wait: index arithmetic, and L2 prefetches of what it reads first
INDEX_MATH = {"program_id", "arange", "minimum", "where", "to", "num_programs", "_tile_rows", "row_tile"}
PREFETCHES = {"prefetch_rows", "prefetch_tile", "prefetch_vector"}


def test_every_engine_kernel_waits_before_it_touches_memory():
    """Launched with PDL, a kernel may start while the one before it still runs: each engine
    kernel waits (grid_dependency.enter) before anything that could read what is not yet written,
    or write what is still being read. Before the wait it may only compute indices and prefetch
    weights (which no kernel writes); the PTX check (pdl_in_ptx) sees no load or store before it.
    A kernel may wait inside a helper that starts its work (linear_triton.tile_product): the same
    holds of the helper's statements before its wait and of the kernel's before the call."""
    import ast
    from pathlib import Path

    functions = {}
    for path in sorted(Path(kcheck.__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                functions[node.name] = (path.name, node)

    def waits_at(node) -> int | None:
        """Index of the statement that waits: enter(PDL), or a call of a helper that waits."""
        for i, statement in enumerate(node.body):
            for call in ast.walk(statement):
                if not isinstance(call, ast.Call):
                    continue
                name = ast.unparse(call.func).rpartition(".")[2]
                if ast.unparse(call) == "enter(PDL)" or (
                    name in functions and name != node.name and waits_at(functions[name][1]) is not None
                ):
                    return i
        return None

    def calls_in(statements) -> set:
        """The names called, through the module-level helpers they call (a helper itself is no call)."""
        names, seen = set(), set()
        todo = [call for b in statements for call in ast.walk(b) if isinstance(call, ast.Call)]
        while todo:
            name = ast.unparse(todo.pop().func).rpartition(".")[2]
            if name in functions and not name.endswith("_kernel") and name not in INDEX_MATH | PREFETCHES:
                if name not in seen:
                    seen.add(name)
                    todo += [c for c in ast.walk(functions[name][1]) if isinstance(c, ast.Call)]
            else:
                names.add(name)
        return names

    def calls_before(node, at: int) -> set:
        return calls_in(node.body[:at])

    kernels, wrong, prefetching, helpers = [], [], [], set()
    for name, (file, node) in functions.items():
        if not name.endswith("_kernel"):
            continue
        kernels.append(name)
        params = {arg.arg: default for arg, default in zip(node.args.args[::-1], node.args.defaults[::-1])}
        at = waits_at(node)
        if at is None or ast.unparse(params.get("PDL", ast.Constant(None))) != "False":
            wrong.append(f"{file}:{name} never calls enter(PDL)")
            continue
        calls = calls_before(node, at)
        entry = [c for c in ast.walk(node.body[at]) if isinstance(c, ast.Call)]
        helper = next((ast.unparse(c.func) for c in entry if ast.unparse(c.func) in functions), None)
        if helper and ast.unparse(node.body[at]) != "enter(PDL)":
            helpers.add(helper)
            calls |= calls_in([arg for c in entry if ast.unparse(c.func) == helper for arg in c.args])  # its arguments
            inner = functions[helper][1]
            calls |= calls_before(inner, waits_at(inner))
            if ast.unparse(inner.body[waits_at(inner)]) != "enter(PDL)":
                wrong.append(f"{file}:{name} waits two helpers deep")
        if calls - INDEX_MATH - PREFETCHES:
            wrong.append(f"{file}:{name} calls {sorted(calls - INDEX_MATH - PREFETCHES)} before its wait")
        if calls & PREFETCHES:
            prefetching.append(name)
    assert len(kernels) >= 17 and not wrong, wrong
    assert {"_linear_kernel", "_qkv_heads_kernel", "_router_kernel", "_attention_out_kernel", "_mlp_out_kernel"} <= set(
        prefetching
    )
    assert helpers == {"tile_product"}


def test_weight_streaming_kernels_prefetch_before_their_wait_where_the_arch_has_pdl():
    """The prefetch is in the PTX before griddepcontrol.wait on sm_90 (kernels.check's `prefetch`),
    not on sm_89 (no PDL: nothing to overlap), and it leaves the wait before every load."""
    name = "linear_small_w4_n2816_k4096_g32"
    rows = [r for r in kcheck.check(["sm_89", "sm_90"], kernel_filter=name) if r["kernel"] == name]
    assert [(r["arch"], r["ok"], r["pdl"], r["prefetch"]) for r in rows] == [
        ("sm_89", True, False, False),
        ("sm_90", True, True, True),
    ]


def test_bad_signature_is_an_error_row(rows):
    missing, bad_type = (_by_kernel(rows, k) for k in ("bad_signature", "bad_type"))
    assert len(missing) == len(bad_type) == 2
    assert all(not r["ok"] and r["registers"] is None for r in missing + bad_type)
    assert "['n', 'factor']" in missing[0]["error"]
    assert "fp33" in bad_type[0]["error"]


def test_broken_or_missing_module_is_an_error_row(rows):
    broken = _by_kernel(rows, f"{HERE}:broken_specs")
    missing = _by_kernel(rows, "flashdesk.kernels.no_such_module")
    assert len(broken) == len(missing) == 1
    assert broken[0]["arch"] == "all" and "compile_specs blew up" in broken[0]["error"]
    assert "ModuleNotFoundError" in missing[0]["error"]


def test_a_dead_worker_is_an_error_row_not_a_crash():
    rows = kcheck.check(["sm_86"], modules=(f"{HERE}:crashing_specs", f"{HERE}:good_specs"))
    assert rows[0]["kernel"] == f"{HERE}:crashing_specs" and not rows[0]["ok"]
    assert "compile worker died" in rows[0]["error"]
    # The dead worker breaks the pool: good_specs fails too unless it finished first.
    assert all(r["kernel"] in (f"{HERE}:good_specs", "tiny_scale") for r in rows[1:])


def test_spilling_kernel_fails_the_cli(capsys):
    code = kcheck.main(
        [
            "--arch",
            "sm_86",
            "--json",
            "--kernel",
            "spill",
            "--module",
            f"{HERE}:good_specs",
            "--module",
            f"{HERE}:spill_specs",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [r["kernel"] for r in out] == ["spill_fp64_w1"]  # --kernel filtered tiny_scale out
    assert out[0]["local_bytes"] > 0 and not out[0]["ok"] and out[0]["spill_stores"] > 0


def test_parse_resource_usage_takes_the_max_over_functions():
    text = """Resource usage:
 Common:
  GLOBAL:0
 Function helper:
  REG:40 STACK:16 SHARED:0 LOCAL:0 CONSTANT[0]:384 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function kernel:
  REG:28 STACK:0 SHARED:1024 LOCAL:8 CONSTANT[0]:392 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    assert kcheck.parse_resource_usage(text) == {"REG": 40, "STACK": 16, "SHARED": 1024, "LOCAL": 8}
    assert [kcheck.capability(a) for a in ("sm_86", "sm90a", 120, "SM_89")] == [86, 90, 120, 89]


_MISSING = [m for m in kcheck.SPEC_MODULES if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(_MISSING), reason=f"spec modules not written yet: {_MISSING}")
def test_engine_kernels_compile_without_spills_on_every_card():
    # TRITON_INTERPRET=1 stays in the environment on purpose: the check must not care.
    result = subprocess.run(
        [sys.executable, "-m", "flashdesk.kernels.check", "--arch", "sm_86,sm_89,sm_90,sm_120"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    failures = [line for line in result.stdout.splitlines() if " FAIL " in line]
    summary = result.stdout.strip().splitlines()[-1:] if result.stdout.strip() else []
    assert result.returncode == 0, "\n".join(failures + summary) or result.stderr[-4000:]


def test_perf_rows_model_a_kernel_from_its_cubin():
    """--perf adds the model's fields from the compiled code: the fp8 full-layer decode split reads
    the KV cache, its SASS main loop gives instructions per key, occupancy gives bytes in flight."""
    rows = kcheck.check(["sm_90"], "decode_split[D=512,full,fp8]", ("flashdesk.kernels.attention_triton",), perf=True)
    assert rows and all(r["ok"] for r in rows), rows
    for r in rows:
        assert (r["role"], r["kv_dtype"], r["head_dim"], r["spill_bytes"]) == ("kv", "fp8", 512, 0)
        assert r["instructions_per_key"] > 0 and r["main_loop"] and r["blocks_per_sm"] >= 1
        assert r["bytes_in_flight_per_sm"] == r["blocks_per_sm"] * r["bytes_in_flight_per_block"] > 0
        assert r["key"].startswith("('flashdesk.kernels.attention_triton', '_decode_split_kernel'")


def test_an_fp8_cache_costs_at_most_half_again_bf16s_instructions_per_key():
    """Decode attention over an fp8 cache, where the target runs it (sm_89 and sm_90, each head dim
    and variant): at most 1.5x the SASS instructions per key of the same kernel over a bf16 cache
    (the conversion packed four bytes per PTX call, the score tile not replicated across warps)."""
    rows = kcheck.check(["sm_89", "sm_90"], "decode_split[D=", ("flashdesk.kernels.attention_triton",), perf=True)
    per_key = {(r["arch"], r["kernel"]): r["instructions_per_key"] for r in rows if r["ok"]}
    pairs = [(arch, name, name.replace(",fp8", ",bf16")) for arch, name in per_key if ",fp8" in name]
    assert len(pairs) >= 8, sorted(per_key)
    for arch, fp8, bf16 in pairs:
        assert per_key[arch, fp8] <= 1.5 * per_key[arch, bf16], (arch, fp8, per_key[arch, fp8], per_key[arch, bf16])


def test_a_row_is_compiled_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDESK_CHECK_CACHE", str(tmp_path))
    first = kcheck.check(["sm_86"], modules=(f"{HERE}:good_specs",))
    again = kcheck.check(["sm_86"], modules=(f"{HERE}:good_specs",))
    assert len(list(tmp_path.glob("*.json"))) == len(first) == len(again) == 1
    assert not first[0].get("cached") and again[0]["cached"]
    assert {k: v for k, v in again[0].items() if k != "cached"} == first[0]


def test_pdl_launch_options_follow_the_card_and_the_switch(monkeypatch):
    """Kernels launch with PDL on a card of compute capability 9.0 or later, unless FLASHDESK_PDL=0;
    never on the CPU (the interpreter has no griddepcontrol), but while a recorder notes launches."""
    import torch

    from flashdesk.kernels import backend

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(backend, "_pdl_capable", lambda index: index == 0)
    monkeypatch.setattr(backend, "interpreted", lambda: False)  # the tests' CUDA tensors would be a GPU's
    try:
        assert backend.pdl_options(torch.device("cpu")) == {}
        with backend.recording_pdl():
            assert backend.pdl_options(torch.device("cpu")) == backend.PDL_ON == {"PDL": True, "launch_pdl": True}
        backend._pdl_allowed.cache_clear()
        assert backend.pdl_options(cuda) == backend.PDL_ON
        assert backend.pdl_options(torch.device("cuda", 1)) == {}  # an older card beside it
        backend.turn_off_pdl("a self-test passed only without it")
        assert backend.pdl_options(cuda) == {}
        backend.turn_off_pdl(None)
        monkeypatch.setenv("FLASHDESK_PDL", "0")
        backend._pdl_allowed.cache_clear()
        assert backend.pdl_options(cuda) == {}
        monkeypatch.setenv("FLASHDESK_PDL", "yes")
        backend._pdl_allowed.cache_clear()
        with pytest.raises(ValueError, match="FLASHDESK_PDL='yes'"):
            backend.pdl_options(cuda)
    finally:
        backend._pdl_allowed.cache_clear()


def test_pdl_counts_only_a_wait_before_every_global_access_and_a_release():
    wait, release = "griddepcontrol.wait ;", "griddepcontrol.launch_dependents ;"
    load, store = "ld.global.b16 { %rs1 }, [ %rd1 + 0 ];", "st.global.b16 [ %rd2 + 0 ], { %rs1 };"
    assert kcheck.pdl_in_ptx("\n".join([wait, release, load, store]))
    assert not kcheck.pdl_in_ptx("\n".join([load, wait, release, store]))  # read before the wait
    assert not kcheck.pdl_in_ptx("\n".join([wait, load, store]))  # never releases the next kernel
    assert not kcheck.pdl_in_ptx("\n".join([load, store]))
    # the wait copied into a branch laid out last: no access of that block before its copy
    prefetch, branch = "prefetch.global.L2 [%rd3];", "$L__BB0_1:"
    assert kcheck.pdl_in_ptx("\n".join([wait, release, load, branch, prefetch, wait, release, load]))
    assert not kcheck.pdl_in_ptx("\n".join([wait, release, load, branch, load, wait, release, store]))


def test_the_expert_items_hand_over_through_release_and_acquire():
    """The small path's one expert launch (moe_small_triton), read in its sm_90 PTX text: a barrier
    between each item's last store and its count-in with a release (Triton puts one before a
    scalar atomic of its own too: this checks the order, not whose barrier it is), and an acquire
    of a counter inside a loop (the down items' spin), all after the PDL wait. A kernel that
    dropped the spin would race on a GPU and still pass every test the interpreter runs (its
    programs run one after another)."""
    import re

    code = (
        "from flashdesk.kernels import check, moe_triton\n"
        "spec = next(s for s in moe_triton.compile_specs() if s.name == 'moe_experts_small_dense3_sym')\n"
        "print(check._triton_compile(spec, 90).asm['ptx'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert kcheck.pdl_in_ptx("\n".join(lines))
    acquires = [i for i, line in enumerate(lines) if re.search(r"\b(ld|atom)\.global\.gpu\.acquire\b", line)]
    assert acquires, "no acquire of a counter"
    labels = {line.split(":")[0]: i for i, line in enumerate(lines) if line.startswith("$L__BB")}
    spins = [  # a branch back to a label at or before an acquire, from after it: the wait's loop
        i
        for i, line in enumerate(lines)
        if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\w+)", line))
        and any(labels.get(m.group(1), i) <= a < i for a in acquires)
    ]
    assert spins, "the acquire is not in a loop"
    releases = [i for i, line in enumerate(lines) if re.search(r"\batom\.global\.gpu\.acq_rel\.add", line)]
    barriers = [i for i, line in enumerate(lines) if "bar.sync" in line or "barrier.sync" in line]
    stores = [i for i, line in enumerate(lines) if "st.global" in line]
    assert len(releases) == 2
    for r in releases:  # every thread's last store before the count comes before a barrier before it
        assert any(max(i for i in stores if i < r) < b < r for b in barriers), lines[r]
