"""Kernel self-tests and per-kernel fallback (kernels/self_test.py, backend.fall_back): every family
passes through the interpreter, every injected fault is caught and sent to torch, the engine's
output then equals the torch path's, and a failed CUDA graph capture runs that step type eagerly."""

import json
import os
import subprocess
import sys

import pytest
import torch

from flashdesk.engine.decode.generation import Engine, GenerationRequest
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.kernels import backend, self_test
from flashdesk.kernels.backend import KERNELS, kernels
from tiny_int4 import write_int4_checkpoint

pytest.importorskip("triton")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def own_data_folder(tmp_path, monkeypatch):
    """Each test keeps its self-test results apart (they are kept per identity in the data folder)."""
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path / "data"))


def inject(monkeypatch, value: str) -> None:
    monkeypatch.setenv(backend.FAULT_VARIABLE, value)
    backend._fault_spec.cache_clear()


def doctor_kernels(tmp_path, faults: str = "") -> tuple[int, dict]:
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        FLASHDESK_KERNELS="triton",
        FLASHDESK_DATA_DIR=str(tmp_path),
        FLASHDESK_INJECT_FAULT=faults,
    )
    run = subprocess.run(
        [sys.executable, "-m", "flashdesk", "doctor", "--kernels", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run.returncode, json.loads(run.stdout.strip().splitlines()[-1])


def test_doctor_kernels_passes_every_family_through_the_interpreter(tmp_path):
    code, report = doctor_kernels(tmp_path)
    assert code == 0 and report["failed"] == [], report
    assert [k["name"] for k in report["kernels"]] == list(KERNELS)
    for k in report["kernels"]:
        assert k["ok"] and k["max_error"] <= k["tolerance"] and k["batch_invariant"] is not False, k
    assert list(tmp_path.glob("self-test/*.json"))  # kept for the next load


def test_every_injected_fault_is_caught(monkeypatch):
    inject(monkeypatch, "all")
    results = self_test.run_self_tests(CPU)
    assert [r.name for r in results if not r.ok] == list(KERNELS)
    assert all(r.max_error > 1 for r in results)  # each far off, not a rounding


def test_only_the_injected_faults_fail(monkeypatch):
    inject(monkeypatch, "kv_write,router,decode_attention")
    failed = [r.name for r in self_test.run_self_tests(CPU) if not r.ok]
    assert failed == ["router", "kv_write", "decode_attention"]


def test_an_unknown_fault_is_refused_by_name(monkeypatch):
    inject(monkeypatch, "linear,lineer")
    with pytest.raises(ValueError, match="unknown 'lineer'.*capture:STEP"):
        backend.injected_faults()


def test_a_kernel_that_raises_fails_its_test_with_the_error(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr("flashdesk.kernels.linear_triton.w4a16_linear", broken)
    [result] = self_test.run_self_tests(CPU, ["linear"])
    assert not result.ok and "no kernel image" in result.error
    self_test.apply([result])
    assert "linear" in backend.fallbacks() and "failed to run" in backend.fallbacks()["linear"]
    assert backend.use_triton(CPU, "glu_linear") is False  # outside kernels("triton") the CPU runs torch anyway
    with kernels("triton"):
        assert not backend.use_triton(CPU, "linear") and backend.use_triton(CPU, "glu_linear")
        assert backend.use_triton(CPU)  # the others stay on Triton


def test_results_are_kept_per_identity_and_reused(monkeypatch):
    runs = []
    real = self_test.run_self_tests

    def counted(device, names=None):
        runs.append(device)
        return real(device, ["rms_norm"])

    monkeypatch.setattr(self_test, "run_self_tests", counted)
    with kernels("triton"):
        first = self_test.ensure(CPU)
        again = self_test.ensure(CPU)
        assert len(runs) == 1 and [r.name for r in again] == [r.name for r in first] == ["rms_norm"]
        inject(monkeypatch, "rms_norm")  # another identity: run again, and this time it falls back
        assert not self_test.ensure(CPU)[0].ok and len(runs) == 2
        assert list(backend.fallbacks()) == ["rms_norm"]


@pytest.fixture(scope="module")
def int4_target(tmp_path_factory):
    target = tmp_path_factory.mktemp("int4-target")
    write_int4_checkpoint(target, "conditional", "fused", True, seed=3)
    return target


def greedy(engine, n=8):
    events = list(
        engine.generate(GenerationRequest([2, 105, 236, 107, 259, 190], n, ignore_eos=True), SpecControl(False))
    )
    return events[-1]


def test_with_every_kernel_faulty_the_engine_falls_back_and_says_so(int4_target, monkeypatch):
    """FLASHDESK_INJECT_FAULT=all on the Triton path: the load's self-tests send every family to
    torch, the greedy output equals the torch path's, and the stats and the note name them."""
    with kernels("torch"):
        want = greedy(Engine.load(int4_target, device="cpu", kv_dtype="fp8")).token_ids
    inject(monkeypatch, "all")
    stages = []
    with kernels("triton"):
        engine = Engine.load(int4_target, device="cpu", kv_dtype="fp8", stage=stages.append)
        got = greedy(engine)
    assert stages[:1] == ["checking the GPU kernels on this card (once per driver and version)"]
    assert got.token_ids == want
    assert got.stats["fallbacks"] == sorted(KERNELS)
    note = engine.fallback_note()
    assert note.startswith("add_norm, attention_out_norms, ") and "doctor --kernels" in note


def test_a_failed_capture_runs_that_step_type_eagerly(monkeypatch):
    """capture:decode makes the one-row capture fail: decode runs eagerly and says why; verify
    blocks keep their graphs (their capture is not even tried here: the CPU has none)."""
    from flashdesk.engine.model.cuda_graphs import _Captured

    inject(monkeypatch, "capture:decode")
    captured = _Captured(torch.zeros(16), None, "target")
    out = captured.run(lambda inputs, m: inputs[:m] * 2, torch.tensor([3.0]), 1)
    assert out.tolist() == [6.0]
    assert captured.error == "decode: RuntimeError: FLASHDESK_INJECT_FAULT=capture:decode (a testing aid)"
    assert not captured.covers(1) and captured.covers(16)
    assert captured.run(lambda inputs, m: inputs[:m] + 1, torch.tensor([3.0]), 1).tolist() == [4.0]  # no retry


def test_a_graph_whose_replay_differs_from_the_eager_run_is_not_kept(monkeypatch):
    """A capture is replayed once against the eager run's bits: a graph that replays other bits
    (here, one that computes from other inputs) fails, and that step type runs eagerly saying so;
    a faithful replay is kept. (No capture on the CPU: the graph is a stand-in.)"""
    from flashdesk.engine.model import cuda_graphs
    from flashdesk.engine.model.gemma4 import ForwardOutput

    class Graph:  # replays fn on the static inputs, or on what it saw at capture (frozen)
        def __init__(self, fn, inputs, out, frozen):
            self.fn, self.inputs, self.out, self.frozen = (
                fn,
                inputs,
                out,
                frozen.clone() if frozen is not None else None,
            )

        def replay(self):
            result = self.fn(self.frozen if self.frozen is not None else self.inputs)
            self.out.logits.copy_(result.logits)

    def forward(inputs):
        return ForwardOutput(logits=inputs[:2] * 3.0, taps=None)

    inputs = torch.tensor([1.0, 2.0])
    for frozen, kept in ((None, True), (torch.tensor([1.0, 5.0]), False)):
        out = forward(inputs)
        eager = [out.logits.clone()]
        graph = Graph(forward, inputs, out, frozen)
        if kept:
            cuda_graphs.replay_matches(graph, out, eager)
            continue
        with pytest.raises(RuntimeError, match="its replay differs from the eager run .output 0: largest difference 9"):
            cuda_graphs.replay_matches(graph, out, eager)

    def capture(self, fn, m):
        out = fn(self.inputs, m)
        cuda_graphs.replay_matches(
            Graph(lambda x: fn(x, m), self.inputs, out, torch.zeros(16)), out, [out.logits.clone()]
        )
        return ("graph", out)

    monkeypatch.setattr(cuda_graphs._Captured, "_capture", capture)
    captured = cuda_graphs._Captured(torch.zeros(16), None, "target")
    got = captured.run(lambda x, m: ForwardOutput(logits=x[:m] + 1.0, taps=None), torch.tensor([3.0]), 1)
    assert got.logits.tolist() == [4.0] and not captured.covers(1)
    assert captured.error.startswith("decode: RuntimeError: its replay differs from the eager run")


def test_kernels_that_fail_only_with_pdl_turn_pdl_off_instead(monkeypatch):
    """Where the families that failed pass when launched without programmatic dependent launch (a
    fault of PDL itself, say a driver's), they stay on Triton and PDL goes off, for this load and
    the next; where they fail without it too, PDL stays on and they fall back."""
    monkeypatch.setattr(backend, "pdl_options", lambda device: {} if backend.pdl_off_reason() else backend.PDL_ON)
    broken_without_pdl = []

    def run(device, names=None):
        bad = backend.pdl_off_reason() is None or "moe" in broken_without_pdl
        return [
            self_test.Result(n, not (bad and n == "moe"), 5.0 if bad and n == "moe" else 0.0, 0.03, None)
            for n in names or KERNELS
        ]

    monkeypatch.setattr(self_test, "run_self_tests", run)
    with kernels("triton"):
        assert all(r.ok for r in self_test.ensure(CPU))
        assert backend.fallbacks() == {} and backend.pdl_off_reason() == self_test.PDL_OFF
        assert Engine.fallback_note().startswith("programmatic dependent launch is off: kernels failed")
        backend.turn_off_pdl(None)
        monkeypatch.setattr(self_test, "run_self_tests", lambda *args: pytest.fail("kept results run again"))
        self_test.ensure(CPU)
        assert backend.pdl_off_reason() == self_test.PDL_OFF
        monkeypatch.setattr(self_test, "run_self_tests", run)
        broken_without_pdl.append("moe")
        results, pdl = self_test.run_and_keep(CPU)
        self_test.apply(results, pdl)
        assert pdl and backend.pdl_off_reason() is None and list(backend.fallbacks()) == ["moe"]


def test_with_a_kernel_on_torch_steps_are_not_captured():
    """A torch kernel may slice the cache by host integers, which a graph replay would freeze at
    the capture's values: no graphs while any family runs on torch."""
    from flashdesk.engine.model.cuda_graphs import graphs_wanted

    cuda = torch.device("cuda")
    assert graphs_wanted(cuda) == (True, "on")
    backend.fall_back("moe", "off by 3.2")
    assert graphs_wanted(cuda) == (False, "off: moe run on torch after their self-test")


def test_a_capture_that_fails_with_pdl_is_tried_once_more_without_it(monkeypatch):
    """Capturing PDL launches is newer in drivers than the rest: a failed capture is tried again
    without PDL, which then stays off, before the step type is given up to eager execution."""
    from flashdesk.engine.model import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "pdl_options", lambda device: {} if backend.pdl_off_reason() else backend.PDL_ON)
    tries = []

    def capture(self, fn, m):
        tries.append(backend.pdl_off_reason())
        if backend.pdl_off_reason() is None:
            raise RuntimeError("operation not permitted when stream is capturing")
        return ("graph", fn(self.inputs, m))

    monkeypatch.setattr(cuda_graphs._Captured, "_capture", capture)
    captured = cuda_graphs._Captured(torch.zeros(16), None, "target")
    captured._failed(lambda inputs, m: inputs[:m], 2, "RuntimeError: operation not permitted when stream is capturing")
    assert 2 in captured.graphs and captured.errors == {}
    assert backend.pdl_off_reason().startswith("a CUDA graph capture failed with it (RuntimeError: operation")
    assert tries == [backend.pdl_off_reason()]


@pytest.mark.parametrize("faults", ["kv_write,router", "decode_attention"])
def test_some_kernels_on_torch_give_the_torch_paths_output(int4_target, monkeypatch, faults):
    """Families fall back alone, whole (the K/V store inside the head norms goes with kv_write, the
    fused router with router), and the output is still the torch path's."""
    with kernels("torch"):
        want = greedy(Engine.load(int4_target, device="cpu", kv_dtype="fp8")).token_ids
    inject(monkeypatch, faults)
    with kernels("triton"):
        got = greedy(Engine.load(int4_target, device="cpu", kv_dtype="fp8"))
    assert got.stats["fallbacks"] == sorted(faults.split(",")) and got.token_ids == want
