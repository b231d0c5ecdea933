"""Run in a subprocess by test_compile_ahead: Triton's real JIT on CPU tensors, for an sm_90 target.

Triton's launch path (the binder that specializes arguments, the cache key, the compile through
ptxas) runs here through launch_log's stand-in driver for an H200 (sm_90); a launch cannot run, so
every launch is made a compile-only one (`warmup=True`), and `_do_compile` counts each
specialization compiled.

This prints one JSON object: the kernels `Engine.compile_kernels` compiled at the real shapes (two
layers, a drafter of two, and Gemma 4's MTP assistant), the seconds it took, whether the cache and
context were left empty, and the kernels a conversation afterwards (a prompt of two chunks, then
follow-ups resumed from the prefix cache; plain steps, DFlash steps at K = 15, 7, 1 and the
automatic length, which measures every verify and draft length, MTP rounds of 4 and the automatic
method) compiled on top: none when the warm-up covers it.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("run without TRITON_INTERPRET: this checks the real JIT")
    from triton.runtime.jit import JITFunction

    from flashdesk.kernels.launch_log import stand_in_driver

    compiled: list[str] = []
    do_compile = JITFunction._do_compile

    def counting(self, *args, **kwargs):
        compiled.append(self.fn.__name__)
        return do_compile(self, *args, **kwargs)

    JITFunction._do_compile = counting
    with stand_in_driver(90):
        print(json.dumps(conversation(compiled)))


def conversation(compiled: list[str]) -> dict:
    import torch
    from triton.runtime.jit import JITFunction

    from flashdesk.engine.decode.generation import Engine, GenerationRequest
    from flashdesk.engine.decode.speculative import AUTO, PREFILL_CHUNK, SpecControl
    from flashdesk.engine.bench.synthetic_model import synthetic_assistant, synthetic_pair
    from flashdesk.engine.decode.mtp import MtpDrafter
    from flashdesk.kernels.compile_ahead import where_compiled

    cpu = torch.device("cpu")
    model, drafter = synthetic_pair(2, cpu, torch.bfloat16, vocab_size=4096)
    engine = Engine(model, None, set(), "fp8", 4096, drafter, MtpDrafter(model, synthetic_assistant(model)))
    began = time.perf_counter()
    seconds = engine.compile_kernels()  # as Engine.load does on a GPU: on every core
    cache, ctx = engine._cache, engine._ctx
    report = {
        "seconds": seconds,
        "wall": time.perf_counter() - began,
        "ahead": sorted(set(compiled)),
        "where": where_compiled(cpu),
        "left_empty": [cache.length, int(cache.position), ctx.length, int(ctx.position)],
    }
    compiled.clear()
    run = JITFunction.run
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: run(  # nothing can run: there is no GPU
        self, *args, grid=grid, warmup=True, **kwargs
    )
    prompt = list(range(5, 5 + PREFILL_CHUNK + 37))  # a whole chunk and a part
    controls = [
        SpecControl(False),
        SpecControl(True, 15),
        SpecControl(True, 7),
        SpecControl(True, 1),
        SpecControl(True, AUTO),
        SpecControl(True, 4, "mtp"),
        SpecControl(True, AUTO, AUTO),
    ]  # AUTO first measures every verify and draft length (of each method)
    report["prefilled"] = []
    for control, more in zip(controls, (48, 17, 5, 30, 12, 3, 1)):
        *_, finish = engine.generate(GenerationRequest(prompt, 6, ignore_eos=True), control)
        report["prefilled"].append(finish.stats["prompt_tokens"] - finish.stats["reused_tokens"])
        prompt = prompt + finish.token_ids + [9] * more  # the follow-up resumes from the prefix cache
    report["after"] = sorted(set(compiled))
    return report


if __name__ == "__main__":
    main()
