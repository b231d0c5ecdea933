"""Kernels compiled ahead (kernels/compile_ahead.py, engine/decode/kernel_warmup.py).

On the GPU a generation's kernels compile in parallel before the first prompt, and nothing the
generation launches afterwards compiles again. That is checked here through Triton's real JIT (not
the interpreter) in a subprocess that stands in a driver for an sm_90 card: its binder specializes
the arguments exactly as on the GPU, ptxas compiles, only the launches themselves are skipped.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashdesk.engine.loading.build import load_target
from flashdesk.engine.decode.kernel_warmup import compile_generation_kernels
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.compile_ahead import compile_ahead, where_compiled
from tiny_checkpoints import write_checkpoint

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ahead")
    write_checkpoint(folder, "causal", seed=3, tokenizer=False)
    return load_target(folder)


def test_under_the_interpreter_nothing_compiles_ahead_and_the_cache_is_untouched(model):
    with compile_ahead() as ahead:
        assert ahead is False  # launches run as usual: the caller skips its block
    with kernels("triton"):
        assert where_compiled(torch.device("cpu")) == "nothing to compile: Triton's interpreter runs the kernels"
    with kernels("torch"):
        assert where_compiled(torch.device("cpu")) == "nothing to compile: the torch kernels run"
    cache = model.new_cache(64, "fp8")
    assert compile_generation_kernels(model, cache) is None
    assert (cache.length, int(cache.position)) == (0, 0)
    model.forward(torch.arange(5, 9), cache)
    with pytest.raises(ValueError, match="empty cache"):
        compile_generation_kernels(model, cache)


def test_after_the_engine_compiled_its_kernels_a_conversation_compiles_nothing(tmp_path):
    pytest.importorskip("triton")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_HOME=str(tmp_path))
    run = subprocess.run(
        [sys.executable, str(HERE / "jit_on_fake_gpu.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert isinstance(report["seconds"], float)
    assert {
        "_linear_kernel",
        "_head_norms_kernel",
        "_decode_split_kernel",
        "_prefill_kernel",
        "_router_kernel",
        "_experts_kernel",
        "_mlp_out_kernel",
        "_rms_norm_kernel",  # the MTP assistant's, besides the target's
    } <= set(report["ahead"])
    assert report["where"].startswith("at load, on ")  # what doctor says on such a machine
    assert report["left_empty"] == [0, 0, 0, 0]  # cache and drafter context: length and device position
    # a prompt of 1061 tokens, follow-ups resuming from the prefix cache with 49, 18, 6, 31, 13 and 4
    # new ones, plain and DFlash steps at K = 15, 7, 1 and the automatic length (which measures
    # every verify and draft length), MTP rounds of 4 and the automatic method: all found compiled
    # (no row count or length is specialized)
    assert report["prefilled"] == [1061, 49, 18, 6, 31, 13, 4]
    assert report["after"] == []
