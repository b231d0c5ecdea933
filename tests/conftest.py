"""Shared test setup.

Qt runs offscreen in the tests: no display is needed and no window pops up on a desktop.
This must happen before pytest-qt creates the QApplication.
"""

import inspect
import os
import tempfile

os.environ["QT_QPA_PLATFORM"] = "offscreen"
# Triton kernels run through Triton's interpreter on CPU tensors (the tests choose them explicitly
# with flashdesk.kernels.backend.kernels("triton")); this must be set before triton is imported.
os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when it is unset
# The app's database and demo models go to a throwaway folder, never the user's data folder.
os.environ.setdefault("FLASHDESK_DATA_DIR", tempfile.mkdtemp(prefix="flashdesk-test-data-"))


import pytest

import flashdesk  # noqa: F401  (first: takes the checkout's root off sys.path, where `kernels/` shadows HF's)

# Test tiers (docs/development.md): the README's command runs the tests no marker names; .ci/run
# then runs `-m "slow or compile"`. By module, with the one interpreted Triton-path variant and the
# performance model's unit tests kept in the default tier.
TIERS = {
    "test_kernels_check": "compile",  # ptxas for four cards
    "test_launch_log": "compile",  # what the engine launches at the real shapes, compiled
    "test_compile_ahead": "compile",  # Triton's JIT through a stand-in driver
    "test_triton_path": "slow",  # interpreted end to end, every layout
    "test_bench_synthetic": "slow",  # two full-size layers on the CPU
    "test_reliability": "slow",  # the reliability figures' quick run
    "test_wheel": "slow",  # builds the wheel and runs the demo from it
    "test_serve_lm_eval": "slow",  # EleutherAI's lm-eval against `serve --demo`, where it is installed
}
SLOW_TESTS = (
    "test_prefix_reuse.py::test_the_triton_path_resumes_the_same_way",
    "test_pipelined_steps.py::test_a_stop_string_undoes_the_step_launched_ahead[triton]",
    "test_perf_model.py::test_a_recorded_step_reads_what_step_bytes_counts",
    "test_memory_plan.py::test_the_plan_matches_what_a_full_context_allocates[fp8-triton]",
    "test_self_test.py::test_some_kernels_on_torch_give_the_torch_paths_output",
    "test_assistant.py::test_the_triton_path_with_fp8_kv_drafts_without_changing_the_output",
    "test_types.py::test_mypy_finds_nothing",  # mypy over what [tool.mypy] lists: about a minute cold
    "test_gpu_check_script.py::test_gpu_check_smoke",  # the GPU script's whole run on the CPU: 15 s
    # 1,600 sampled generations (12 s); the greedy tests beside it check the penalties' rows exactly
    "test_penalties.py::test_sampling_with_penalties_and_speculation_is_distributed_as_without",
    # each below has a cousin in the default tier that checks the same through another door:
    # the window's test_speculation_changes_mid_reply_take_effect_and_change_nothing sends the worker
    # the same messages (auto draft lengths: test_draft_length.py)
    "test_worker.py::test_speculation_changes_apply_mid_generation_and_change_nothing",
    "test_worker.py::test_cancel_stops_within_one_step",  # the window's test_escape_stops_within_one_step
    # test_serve.py::test_the_command_prints_its_url_serves_and_stops_on_ctrl_c: the same command's life
    "test_serve_guard.py::test_sigterm_stops_the_server_with_its_closing_line_and_ipv6_loopback_binds",
    # min_p at verification: test_rejection_sampling_reproduces_the_target_distribution[min-p]; the
    # engine's sampling with speculation: test_engine_samples_with_speculation_like_without
    "test_lossless_sampling.py::test_engine_samples_with_min_p_and_speculation_like_without",
    "test_lossless_sampling.py::test_rejection_sampling_reproduces_the_target_distribution[top-p]",  # [min-p-top-p]
    # every family faulty at once: the default tier's test_with_every_kernel_faulty_the_engine_falls_back_and_says_so
    # loads with them all faulty (each caught, each named); test_only_the_injected_faults_fail runs the self-tests
    "test_self_test.py::test_every_injected_fault_is_caught",
    # `doctor --kernels` in its own process: test_only_the_injected_faults_fail passes every other family in-process
    "test_self_test.py::test_doctor_kernels_passes_every_family_through_the_interpreter",
    # top-k at verification: the plain and min-p-top-p cases beside it run the same filters' path
    "test_lossless_sampling.py::test_rejection_sampling_reproduces_the_target_distribution[top-k]",
    # an interpreted end-to-end Triton-path run beside the default variant; its kernels' cases
    # (channel-wise, group 8, symmetric or not, dense beside int4) run in test_kernels_linear/_moe
    "test_checkpoint_variants.py::test_the_mixed_variant_runs_the_triton_path_as_the_torch_path",
)
DEFAULT_TIER = (
    "test_triton_path.py::test_triton_path_equals_transformers_and_the_torch_path[conditional-per_expert-False]",
    "test_triton_path.py::test_kernels_are_named_for_each_choice",
)


@pytest.fixture(autouse=True)
def _no_kernel_fallbacks_left_behind():
    """A test that sends kernel families to torch (self-tests, injected faults) leaves none behind."""
    yield
    import sys

    backend = sys.modules.get("flashdesk.kernels.backend")
    if backend is not None:
        backend.clear_fallbacks()
        backend.turn_off_pdl(None)
        backend._fault_spec.cache_clear()


# The default tier's longest files (tens of seconds each on two cores), longest first. pytest-xdist
# hands out whole files in collection order (`--no-loadscope-reorder` in pyproject's addopts), so
# starting these first leaves the short files to even out the workers at the end, rather than one
# worker finishing a long file alone. Only the order of files changes; the rest follow in theirs.
LONGEST_FIRST = (
    "test_app_window",
    "test_app_context",
    "test_self_test",
    "test_lossless_sampling",
    "test_triton_path",
    "test_worker",
    "test_app_bench",
    "test_checkpoint_variants",
    "test_serve_panel",
    "test_app_download",
    "test_project",
    "test_app_recommended",
    "test_structured_output",
    "test_prefix_reuse",
    "test_kernels_moe",
    "test_models",
    "test_serve",
    "test_bench",
    "test_speculative",
    "test_serve_worker",
    "test_serve_guard",
    "test_int4",
    "test_app_remote",
    "test_app_branches",
    "test_memory_plan",
)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        nodeid = item.nodeid.removeprefix("tests/")
        if nodeid.startswith(DEFAULT_TIER):
            continue
        marker = TIERS.get(item.module.__name__.rpartition(".")[2])
        if marker is None and nodeid.startswith(SLOW_TESTS):
            marker = "slow"
        if marker is not None:
            item.add_marker(getattr(pytest.mark, marker))
    yield
    # after the other plugins (the markers' deselection, the fixtures' grouping, kept within a file)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))


def _interpret_without_overflow_checks() -> None:
    """The interpreter checks every integer add and multiply for overflow, which makes it several
    times slower; the tiny test shapes cannot overflow, and the GPU never checks."""
    try:
        import dataclasses

        import triton.runtime.interpreter as interpreter

        options = interpreter.interpreter_builder.options
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    except Exception:  # noqa: BLE001 - another triton version: run with the checks
        pass


def _find_interpreted_builtins_once() -> None:
    """At every launch, and at every call of a jit function inside a kernel, the interpreter finds
    triton.language's builtins to patch with `inspect.getmembers` over its modules and classes,
    about a sixth of an interpreted run. Which names are builtins never changes: look them up once
    (before any launch has patched one) and patch, as before, those of them not already patched."""
    try:
        import inspect

        import triton.language as tl
        import triton.runtime.interpreter as interpreter

        is_builtin = tl.core.is_builtin
        names: dict = {}

        def builtin_names(pkg) -> list:
            if pkg not in names:
                names[pkg] = [name for name, member in inspect.getmembers(pkg) if is_builtin(member)]
            return names[pkg]

        for pkg in (tl, tl.tensor, tl.math, tl.core, tl.core.tensor, tl.core.tensor_descriptor_base):
            builtin_names(pkg)  # all unpatched now: no kernel has run

        def patch_builtin(pkg, builder, scope) -> None:
            for name in builtin_names(pkg):
                member = getattr(pkg, name)
                if is_builtin(member):
                    interpreter._patch_attr(pkg, name, member, builder, scope)

        interpreter._patch_builtin = patch_builtin
    except Exception:  # noqa: BLE001 - another triton version: look them up at every launch
        pass


_interpret_without_overflow_checks()
_find_interpreted_builtins_once()


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """The demo pair on the CPU behind serve's Runner (speculation on), one per test file that asks."""
    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.decode.speculative import SpecControl
    from flashdesk.engine.hub.demo import create_demo
    from flashdesk.engine.serve.runner import Runner

    target, drafter = create_demo(tmp_path_factory.mktemp("runner-demo"))
    runner = Runner(Engine.load(target, device="cpu", draft_dir=drafter), SpecControl(enabled=True))
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def spec_pair(tmp_path_factory):
    """A tiny target and a drafter trained on it: (our engine, our engine's folder pair, the
    transformers target, z-lab's reference drafter), the references loaded from the same files."""
    from flashdesk.engine.decode.generation import Engine
    from tiny_checkpoints import write_checkpoint
    from tiny_drafter import load_reference_drafter, write_drafter

    target_dir = tmp_path_factory.mktemp("spec-target")
    draft_dir = tmp_path_factory.mktemp("spec-drafter")
    reference = write_checkpoint(target_dir, "causal", seed=1)
    write_drafter(draft_dir, seed=2, target=reference)
    engine = Engine.load(target_dir, device="cpu", draft_dir=draft_dir)
    return engine, (target_dir, draft_dir), reference, load_reference_drafter(draft_dir)


READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def _from_triton() -> bool:
    """Triton's interpreter copies tensors to the host to run a kernel: that is the CPU stand-in for
    a launch, not a read by the engine."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] == "triton":
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def forbid_reads(monkeypatch):
    """Inside a step, any device-to-host read but the step's one `read_to_host` raises."""
    import torch

    from flashdesk.engine.decode import speculative

    state = {"armed": False, "allowed": False, "reads": 0}
    for name in READS:
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, _original=original, _name=name, **kwargs):
            if state["armed"] and not state["allowed"] and not _from_triton():
                raise AssertionError(f"Tensor.{_name} inside a decode step (a host sync)")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, guarded)
    original_read = speculative.read_to_host

    def counted(t):
        state["reads"] += 1
        state["allowed"] = True
        try:
            return original_read(t)
        finally:
            state["allowed"] = False

    monkeypatch.setattr(speculative, "read_to_host", counted)
    return state
