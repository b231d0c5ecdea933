"""Run in a subprocess by test_launch_log: every specialization Triton's JIT compiles for a GPU
when the engine loads at the real shapes, recorded through a stand-in driver (launch_log.record_compiles).

Two layers of Gemma 4 26B-A4B (a sliding and a full one, int4 like the real checkpoint) with the
bf16 and the int4 drafter, fp8 and bf16 KV: `Engine.compile_kernels` runs the passes of a whole
generation (test_compile_ahead checks that a conversation launches nothing more). Then what
gpu_check times: `bench --synthetic` with two layers (whole-vocabulary head, 8K-token prefill, a
4K context filled to its end, the int4 drafter). Writes the launches to the file named by argv[1],
for `kernels.check --module flashdesk.kernels.launch_log`.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("run without TRITON_INTERPRET: this records Triton's real JIT")
    import torch

    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.bench.synthetic_model import synthetic_drafter, synthetic_target
    from flashdesk.engine.cli.bench_synthetic import run_synthetic
    from flashdesk.kernels.launch_log import record_compiles, save

    with record_compiles() as launches:
        model = synthetic_target(2, "cpu", torch.bfloat16, vocab_size=4096)
        for quantize in (None, "int4"):
            drafter = synthetic_drafter(model, quantize=quantize)
            for kv in ("fp8", "bfloat16"):
                Engine(model, None, set(), kv, 4096, drafter).compile_kernels()
        run_synthetic(
            layers=2, context=4096, device="cpu", dtype="bfloat16", kv_dtype="fp8", repeats=1, log=lambda message: None
        )
    save(launches, sys.argv[1])
    print(len(launches))


if __name__ == "__main__":
    main()
