"""Shared test setup.

Qt runs offscreen in the tests: no display is needed and no window pops up on a desktop.
This must happen before pytest-qt creates the QApplication.
"""

import os
import tempfile

os.environ["QT_QPA_PLATFORM"] = "offscreen"
# Triton kernels run through Triton's interpreter on CPU tensors (the tests choose them explicitly
# with flashdesk.kernels.backend.kernels("triton")); this must be set before triton is imported.
os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when it is unset
# The app's database and demo models go to a throwaway folder, never the user's data folder.
os.environ.setdefault("FLASHDESK_DATA_DIR", tempfile.mkdtemp(prefix="flashdesk-test-data-"))


import pytest  # noqa: E402


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


def _interpret_dots_row_by_row() -> None:
    """The interpreter computes `tl.dot` with numpy's matmul, whose BLAS may sum a row's products in an
    order that depends on how many rows the call has (it did on the AVX-512 EPYC of 2026-12-01): rows of a
    16-row call differ from the same rows computed alone, in the last bit, on the CPU only. The GPU's
    tile sums a row in a fixed order whatever the rows; computing each row of a 2-D dot on its own
    gives the interpreter that same property, so the batch-invariance tests test our kernels, not BLAS."""
    try:
        import numpy as np
        import triton.runtime.interpreter as interpreter

        plain_dot = interpreter.InterpreterBuilder.create_dot

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            if a.data.ndim != 2 or a.data.dtype != np.float32 or b.data.dtype != np.float32:
                return plain_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
            rows = [np.matmul(row[None, :], b.data, dtype=d.data.dtype) for row in a.data]
            return interpreter.TensorHandle(np.concatenate(rows) + d.data, d.dtype.scalar)

        interpreter.InterpreterBuilder.create_dot = create_dot
    except Exception:  # noqa: BLE001 - another triton version: its own dot
        pass


_interpret_without_overflow_checks()
_interpret_dots_row_by_row()


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
