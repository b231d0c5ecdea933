"""Everything GPU-side in one call: correctness on CUDA, then full-size timings and memory.

For a session that is lent a GPU (one H200, torch 2.11, triton 3.6, no internet, minutes of time):
    PYTHONUNBUFFERED=1 python3 packaging/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/log"
It needs no install: it puts the checkout on sys.path as the package `flashdesk`. Results go to
$OUT/gpu_check.json (rewritten after every section) and a summary to stdout; each section records
its own failure and the rest go on. After `--deadline` seconds (540) it prints every thread's stack
and exits, so a hang inside the device tool's 10-minute limit still brings back what finished.
`--smoke` runs the same code on the CPU with small shapes, so the script is tested without a GPU.

Sections, most useful first (an H200 should take under 5 minutes):
1. environment: torch, CUDA, GPU, triton, whether programmatic dependent launch is on.
2. the kernel self-tests the first load runs (kernels/self_test.py): every kernel family against its
   torch reference at the real shapes, and 16-row blocks against the same rows alone.
3. tiny model on the device vs the CPU (fp32 logits), bf16 and fp8 KV on the device, greedy output
   with DFlash equal to without, a follow-up resumed from the prefix cache equal to a fresh prefill,
   int4 weights; batch invariance in bf16 with fp8 KV: a 16-token block's logits equal the same
   tokens decoded one by one, bit for bit (required on the GPU; the CPU's torch path is not).
4. `flashdesk bench --synthetic --json`, all 30 layers, the steps users run: a 4K context in a cache
   of the card's default capacity (262,144 positions), AR, verify 1..16 and draft (+ int4 draft)
   replayed from CUDA graphs, each against the bytes it reads and the card's copy bandwidth; and
   beside each of ar, verify-16 and draft the performance model's time for this card
   (kernels/perf_model.py), so the first GPU calibrates the model.
5. full-size Gemma 4 26B-A4B (random int4 weights, bf16 embedding) + the full-size drafter (random):
   memory held vs the memory plan, the same batch invariance at the full size, the seconds the
   kernels took to compile ahead on every core, prefill speed, AR decode step, DFlash step at
   K = 4, 8, 15, for fp8 and bf16 KV; the memory a prompt filling 8K, 32K and 64K tokens allocates
   against the memory plan (the long prefills).
6. every kernel the run compiled, as the driver loaded it: registers and spills (none expected).
7. kernel profiles of the ar, verify-16 and draft steps (bench --synthetic --profile over 6 layers:
   the same kernels a layer runs), last: attaching CUPTI to graph replays has crashed some CUDA
   versions.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_flashdesk():
    """Make the checkout importable as `flashdesk` without installing it."""
    try:
        import flashdesk.engine  # noqa: F401

        return
    except ImportError:
        pass
    link_dir = Path(tempfile.mkdtemp())
    (link_dir / "flashdesk").symlink_to(ROOT)
    sys.path.insert(0, str(link_dir))


def real_configs() -> tuple[dict, dict]:
    """The real pair's raw configs, as `bench --synthetic` builds them (docs/model.md)."""
    from flashdesk.engine.model import known_models

    return known_models.REAL_TARGET, known_models.REAL_DRAFTER


def smoke_configs() -> tuple[dict, dict]:
    """The same architecture at small shapes: the tiny correctness model and the CPU smoke run."""
    target, drafter = real_configs()
    return (
        dict(
            target,
            vocab_size=512,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=6,
            layer_types=target["layer_types"][:6],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            global_head_dim=64,
            num_global_key_value_heads=1,
            sliding_window=16,
            num_experts=8,
            top_k_experts=2,
            moe_intermediate_size=32,
            max_position_embeddings=4096,
        ),
        dict(
            drafter,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=8,
            vocab_size=512,
            num_target_layers=6,
            max_position_embeddings=4096,
            dflash_config={"mask_token_id": 4, "target_layer_ids": [1, 4]},
        ),
    )


def smoke_assistant_config() -> dict:
    """Gemma 4's MTP assistant at the smoke target's shapes (its width, its K/V geometry)."""
    from flashdesk.engine.model import known_models

    real, target = known_models.assistant_raw(), smoke_configs()[0]
    geometry = ("vocab_size", "num_attention_heads", "sliding_window", "max_position_embeddings")
    kv = ("num_key_value_heads", "head_dim", "global_head_dim", "num_global_key_value_heads")
    text = dict(real["text_config"], **{key: target[key] for key in geometry + kv})
    text.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_kv_shared_layers=2)
    text["layer_types"] = ["sliding_attention", "full_attention"]
    return dict(real, backbone_hidden_size=target["hidden_size"], text_config=text)


def random_target(cfg, device, dtype, int4: bool, seed: int = 0):
    """A Gemma4 with random weights straight on the device (no files): int4 where the real one is."""
    import torch

    from flashdesk.engine.model.gemma4 import Gemma4
    from flashdesk.engine.loading.weights import expected_shapes
    from flashdesk.kernels.int4 import Int4Weight

    gen = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        norm = name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale"))
        packable = not norm and not name.endswith(("embed_tokens.weight", "router.proj.weight")) and len(shape) >= 2
        if int4 and packable and shape[-1] % 32 == 0:
            packed = torch.randint(
                -(2**31), 2**31 - 1, (*shape[:-1], shape[-1] // 8), device=device, dtype=torch.int32, generator=gen
            )
            scale = torch.full((*shape[:-1], shape[-1] // 32), 0.02 / 4, device=device, dtype=dtype)
            weights[name] = Int4Weight(packed, scale, None, 32)
        elif norm:
            weights[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            weights[name] = (torch.randn(shape, device=device, dtype=torch.float32, generator=gen) * 0.02).to(dtype)
    return Gemma4(cfg, weights, device, dtype)


def random_drafter(dcfg, target, seed: int = 1):
    import torch

    from flashdesk.engine.model.drafter import Drafter, draft_expected_shapes

    gen = torch.Generator(device=target.device).manual_seed(seed)
    weights = {
        name: (
            torch.ones(shape, device=target.device)
            if name.endswith("norm.weight")
            else torch.randn(shape, device=target.device, generator=gen) * 0.02
        ).to(target.dtype)
        for name, shape in draft_expected_shapes(dcfg).items()
    }
    return Drafter(dcfg, weights, target)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed(device, fn, repeat: int):
    fn()  # warm up
    samples = []
    for _ in range(repeat):
        t0 = sync(device)
        fn()
        samples.append(sync(device) - t0)
    return statistics.median(samples)


def block_rows_equal_alone(model, kv: str, context: int, seed: int = 5, rows: int = 16) -> dict:
    """Batch invariance where it matters: after `context` tokens, the logits of a 16-token block
    (a verify) against the same tokens decoded one at a time (the first `rows` of them), bit for
    bit. The Triton path promises equality on the GPU (bf16 weights, fp8 KV); the CPU's torch
    matmuls do not."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.cfg.vocab_size, (context + 16,), generator=gen).to(model.device)
    cache = model.new_cache(context + 16, kv)
    model.forward(ids[:context], cache, logits_rows="last")
    together = model.forward(ids[context:], cache, logits_rows="all").logits[:rows]
    cache.rollback(context)
    alone = torch.cat(
        [model.forward(ids[i : i + 1], cache, logits_rows="last").logits for i in range(context, context + rows)]
    )
    return {
        "equal": bool(torch.equal(together, alone)),
        "max_abs_diff": (together.float() - alone.float()).abs().max().item(),
        "argmax_equal": bool(torch.equal(together.argmax(-1), alone.argmax(-1))),
    }


def drafts_equal_eager(model, drafter, prompt: list[int]) -> dict:
    """The drafter's context is what a CUDA graph of it, or writing it before the step's read,
    could get wrong without changing a single output token (the target verifies every draft): so
    compare each step's drafts with graphs and the context written ahead against eager steps that
    write only the accepted rows after the read. The same ids on the Triton path (batch invariance)."""
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import Decoder, SpecControl
    from flashdesk.engine.model.cuda_graphs import StepGraphs, graphs_wanted

    runs, context = [], len(prompt) + 128
    for fast in (True, False):
        cache, ctx = model.new_cache(context, "fp8", slack=16), drafter.new_context(context)
        graphs = (
            StepGraphs(model, cache, drafter.cfg.target_layer_ids, drafter, ctx)
            if fast and graphs_wanted(model.device)[0]
            else None
        )
        decoder = Decoder(model, drafter, context, "fp8", SamplingParams(), set(), cache, ctx, graphs)
        decoder.context_ahead = fast and decoder.context_ahead
        decoder.prefill(prompt)
        steps = [decoder.step(64, SpecControl(k > 0, k)) for k in (15, 0, 7, 15)]  # a plain step's features wait
        runs.append(
            {
                "drafts": [s.draft for s in steps],
                "graphs": graphs is not None and graphs.error is None,
                "ahead": decoder.context_ahead,
            }
        )
    return {"equal": runs[0]["drafts"] == runs[1]["drafts"], "graphs": runs[0]["graphs"], "ahead": runs[0]["ahead"]}


def section_environment(device):
    import torch

    info = {"torch": torch.__version__, "device": str(device), "python": sys.version.split()[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        info.update(
            gpu=props.name,
            memory_gib=round(total / 2**30, 1),
            free_gib=round(free / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
    from flashdesk.kernels.backend import pdl_options

    # programmatic dependent launch: every step below runs with it where this is True (sm_90+)
    info["pdl"] = bool(pdl_options(device))
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError as exc:
        info["triton"] = f"missing: {exc}"
    return info


def section_kernel_self_tests(device, smoke: bool):
    """What the first load on a card runs: every kernel family against its torch reference
    (`flashdesk doctor --kernels`). On the CPU (--smoke) through Triton's interpreter."""
    from dataclasses import asdict

    from flashdesk.kernels import self_test
    from flashdesk.kernels.backend import interpreted, kernels

    if device.type != "cuda" and not interpreted():
        return {"skipped": "the Triton kernels run on a GPU (or on the CPU under TRITON_INTERPRET=1)"}
    with kernels("triton"):
        results = self_test.run_self_tests(device)
    for r in results:
        print(
            f"{'ok  ' if r.ok else 'FAIL'} {r.name:<20} {r.max_error} {r.batch_invariant} {r.error or ''}", flush=True
        )
    return {"ok": all(r.ok for r in results), "kernels": [asdict(r) for r in results]}


def section_tiny_correctness(device, smoke: bool, new_tokens: int = 48):
    """The tiny model on the device against the same weights on the CPU, and exactness checks
    (tests/test_launch_log.py compiles for sm_90 every kernel launch this makes)."""
    import torch

    from flashdesk.engine.model.config import parse_config, parse_draft_config
    from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
    from flashdesk.engine.decode.speculative import SpecControl

    target_raw, draft_raw = smoke_configs()
    cfg, dcfg = parse_config(target_raw), parse_draft_config(draft_raw)
    out = {}
    cpu = random_target(cfg, torch.device("cpu"), torch.float32, int4=False)
    dev = random_target(cfg, torch.device("cpu"), torch.float32, int4=False)  # same seed, same weights
    _move(dev, device)
    ids = torch.randint(5, 512, (40,), generator=torch.Generator().manual_seed(0))
    ref = cpu.forward(ids, cpu.new_cache(48, "float32")).logits
    got = dev.forward(ids.to(device), dev.new_cache(48, "float32")).logits.cpu()
    out["fp32_max_abs_logit_diff_vs_cpu"] = (got - ref).abs().max().item()
    for kv in ("bfloat16", "fp8"):
        logits = dev.forward(ids.to(device), dev.new_cache(48, kv)).logits.cpu()
        out[f"{kv}_kv_max_abs_logit_diff"] = (logits - ref).abs().max().item()
    drafter = random_drafter(dcfg, dev)
    engine = Engine(dev, None, {1}, "fp8", 4096, drafter)
    prompt = ids[:12].tolist()

    def tokens(control):
        events = engine.generate(GenerationRequest(prompt, new_tokens, ignore_eos=True), control)
        return [e for e in events if isinstance(e, FinishEvent)][0].token_ids

    out["pipelined"] = engine.pipelined  # on a GPU: each step launched before the last one's tokens are handed on
    plain = tokens(SpecControl(False))
    out["dflash_greedy_equals_ar"] = all(tokens(SpecControl(True, k)) == plain for k in (1, 4, 15))
    out["drafts_with_graphs_equal_eager"] = drafts_equal_eager(dev, drafter, prompt)
    # prefix reuse (with CUDA graphs on the GPU): a follow-up past the rings' slack, resumed from the
    # snapshot at the first prompt's end, equals the same prompt prefilled from scratch
    follow = prompt + plain[:20] + ids[12:20].tolist()  # diverges 27+ positions before the end
    run = [
        e
        for e in engine.generate(GenerationRequest(follow, new_tokens // 2, ignore_eos=True))
        if isinstance(e, FinishEvent)
    ][0]
    again = [
        e
        for e in engine.generate(GenerationRequest(follow, new_tokens // 2, ignore_eos=True, reuse=False))
        if isinstance(e, FinishEvent)
    ][0]
    out["reuse_tokens"] = run.stats["reused_tokens"]
    out["reuse_equals_fresh_prefill"] = run.token_ids == again.token_ids and run.stats["reused_tokens"] > 0
    int4_dev = random_target(cfg, device, torch.float32, int4=True)
    out["int4_logits_finite"] = bool(
        torch.isfinite(int4_dev.forward(ids.to(device), int4_dev.new_cache(48, "float32")).logits).all()
    )
    bf16_int4 = random_target(cfg, device, torch.bfloat16, int4=True)
    # off the GPU only what it launches counts (no promise there, and interpreted steps are slow)
    out["bf16_int4_fp8_block_rows_equal_alone"] = block_rows_equal_alone(
        bf16_int4, "fp8", 40, rows=16 if device.type == "cuda" else 1
    )
    ok = (
        out["fp32_max_abs_logit_diff_vs_cpu"] < 1e-3
        and out["dflash_greedy_equals_ar"]
        and out["int4_logits_finite"]
        and out["reuse_equals_fresh_prefill"]
        and out["drafts_with_graphs_equal_eager"]["equal"]
        and (device.type != "cuda" or out["bf16_int4_fp8_block_rows_equal_alone"]["equal"])
    )
    out["ok"] = ok
    return out


def _move(model, device):
    """Move a model built on the CPU to the device (tests only: the engine loads straight to it)."""
    import torch

    def to(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    model.device = device
    model.embed, model.final_norm, model.embed_scale = to(model.embed), to(model.final_norm), to(model.embed_scale)
    model.rope_freqs = to(model.rope_freqs)
    for layer in model.layers:
        for key, value in vars(layer).items():
            if isinstance(value, torch.Tensor):
                setattr(layer, key, to(value))
        layer.norms = {k: to(v) for k, v in layer.norms.items()}


def section_full_size(device, smoke: bool, kv_dtypes):
    """Full-size shapes with random weights: memory against the plan, and step timings."""
    import torch

    from flashdesk.engine.model.config import parse_config, parse_draft_config
    from flashdesk.engine.loading.memory_plan import drafter_weight_bytes, int4_weight_bytes
    from flashdesk.engine.decode.kernel_warmup import compile_generation_kernels
    from flashdesk.engine.bench.synthetic_model import synthetic_assistant
    from flashdesk.engine.decode.mtp import MtpDrafter
    from flashdesk.engine.decode.speculative import Decoder, SpecControl
    from flashdesk.engine.decode.sampling import SamplingParams

    target_raw, draft_raw = smoke_configs() if smoke else real_configs()
    cfg, dcfg = parse_config(target_raw), parse_draft_config(draft_raw)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    target = random_target(cfg, device, dtype, int4=True)
    drafter = random_drafter(dcfg, target)
    mtp = MtpDrafter(target, synthetic_assistant(target, raw=smoke_assistant_config() if smoke else None))
    out["build_seconds"] = round(time.perf_counter() - t0, 1)
    if device.type == "cuda":
        held = torch.cuda.memory_allocated(device) - base
        planned = int4_weight_bytes(cfg, dtype_bytes=2) + drafter_weight_bytes(dcfg)
        out["weights_held_gib"] = round(held / 2**30, 3)
        out["weights_planned_gib"] = round(planned / 2**30, 3)
    prompt_len = 64 if smoke else 1024
    prompt = torch.randint(5, cfg.vocab_size, (prompt_len,)).tolist()
    for kv in kv_dtypes:
        decoder = Decoder(target, drafter, prompt_len + 2048, kv, SamplingParams(), set())
        seconds = compile_generation_kernels(target, decoder.cache, drafter, decoder.ctx)  # None on the CPU
        row = {
            "kernels_compiled_ahead_seconds": None if seconds is None else round(seconds, 1),
            "block_rows_equal_alone": block_rows_equal_alone(target, kv, prompt_len),
        }
        t0 = sync(device)
        decoder.prefill(prompt)
        row["prefill_tokens_per_second"] = round(prompt_len / (sync(device) - t0), 1)
        if device.type == "cuda":
            row["peak_after_prefill_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)

        def ar_step():
            decoder.step(10**6, SpecControl(False))

        row["ar_step_ms"] = round(1000 * timed(device, ar_step, 5 if smoke else 20), 3)
        for k in (4, 8, 15):

            def spec_step():
                decoder.step(10**6, SpecControl(True, k))  # a random drafter: about 1 token per step

            row[f"dflash_k{k}_step_ms"] = round(1000 * timed(device, spec_step, 3 if smoke else 10), 3)
            row[f"dflash_k{k}_projected_speedup_at_tau"] = {
                tau: round(tau * row["ar_step_ms"] / row[f"dflash_k{k}_step_ms"], 2) for tau in range(1, min(k + 2, 9))
            }
        decoder = None  # its cache goes before the next one is made
        row.update(_mtp_steps(device, target, mtp, prompt, kv, smoke))
        out[kv] = row
    out["memory_plan"] = _plan_against_allocation(
        device, target, drafter, (256, 512, 1024) if smoke else (8192, 32768, 65536)
    )
    out["ok"] = device.type != "cuda" or all(out[kv]["block_rows_equal_alone"]["equal"] for kv in kv_dtypes)
    return out


def _mtp_steps(device, target, mtp, prompt: list[int], kv: str, smoke: bool) -> dict:
    """Gemma 4's MTP assistant (random weights) drafting 2, 4 and 8 tokens a round over the target's
    `kv` cache: each round's time, and the speed-up it would give at each mean acceptance length."""
    from flashdesk.engine.decode.speculative import Decoder, SpecControl
    from flashdesk.engine.decode.sampling import SamplingParams

    decoder = Decoder(target, None, len(prompt) + 2048, kv, SamplingParams(), set(), mtp=mtp)
    decoder.prefill(prompt)
    ar = 1000 * timed(device, lambda: decoder.step(10**6, SpecControl(False)), 5 if smoke else 20)
    row = {}
    for k in (2, 4, 8):
        ms = 1000 * timed(device, lambda: decoder.step(10**6, SpecControl(True, k)), 3 if smoke else 10)
        row[f"mtp_k{k}_step_ms"] = round(ms, 3)
        row[f"mtp_k{k}_projected_speedup_at_tau"] = {tau: round(tau * ar / ms, 2) for tau in range(1, k + 2)}
    return row


def _plan_against_allocation(device, target, drafter, contexts):
    """A prompt filling each context (its worst prefill chunk attends over all of it): the device
    memory it allocates beyond the weights, against the memory plan's context-dependent part. On
    the Triton path the prefill attention allocates no scores, so it should come in under."""
    import torch

    from flashdesk.engine.decode.generation import Engine, GenerationRequest
    from flashdesk.engine.loading.memory_plan import WORKSPACE_FIXED_BYTES, plan_memory

    rows = []
    kv = "fp8" if device.type == "cuda" else "float32"
    for context in contexts:
        engine = Engine(target, None, set(), kv, context, drafter)
        engine.prefix_budget = 0
        prompt = torch.randint(5, target.cfg.vocab_size, (context - 1,)).tolist()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        t0 = sync(device)
        for _ in engine.generate(GenerationRequest(prompt, 1, ignore_eos=True)):
            pass
        seconds = sync(device) - t0
        plan = plan_memory(target.cfg, 0, context, kv, drafter.cfg, dtype_bytes=target.dtype.itemsize)
        planned = plan.kv_bytes + plan.draft_context_bytes + plan.workspace_bytes - WORKSPACE_FIXED_BYTES
        row = {
            "context": context,
            "prefill_tokens_per_second": round((context - 1) / seconds, 1),
            "planned_gib": round(planned / 2**30, 3),
        }
        if device.type == "cuda":
            used = torch.cuda.max_memory_allocated(device) - base
            row.update(allocated_gib=round(used / 2**30, 3), allocated_over_planned=round(used / planned, 3))
        rows.append(row)
        del engine
    return rows


def section_compiled_kernels():
    """Every Triton kernel this run compiled, as the driver loaded it: registers and spills from this
    machine's own ptxas. kernels.check predicts them without a GPU; this checks the prediction."""
    import importlib

    from triton.runtime.jit import JITFunction

    from flashdesk.kernels.check import SPEC_MODULES

    rows = []
    for module_name in SPEC_MODULES:
        for name, fn in vars(importlib.import_module(module_name)).items():
            if not isinstance(fn, JITFunction):  # (the interpreter's functions: nothing compiled)
                continue
            for kernel_cache, *_ in fn.device_caches.values():
                for kernel in kernel_cache.values():
                    kernel._init_handles()  # loads it: the driver reports registers and spills
                    rows.append(
                        {
                            "kernel": name,
                            "registers": kernel.n_regs,
                            "spills": kernel.n_spills,
                            "shared_bytes": kernel.metadata.shared,
                            "num_warps": kernel.metadata.num_warps,
                        }
                    )
    spilling = [row for row in rows if row["spills"]]
    return {
        "ok": not spilling,
        "compiled": len(rows),
        "spilling": spilling,
        "max_registers": max((row["registers"] for row in rows), default=None),
        "max_shared_bytes": max((row["shared_bytes"] for row in rows), default=None),
    }


DEFAULT_CAPACITY = 262144  # the context limit the app picks on an H200 and a 24 GB card: the longest that fits
# the model's steps by the names the bench measures them under: its draft is the default int4 drafter's
MEASURED_AS = {"ar": "ar", "verify-16": "verify-16", "draft": "draft-int4"}


def section_synthetic_bench(device, smoke: bool, profile: bool = False):
    """`flashdesk bench --synthetic --json` through the CLI: all 30 layers on the GPU (prefill 1024 and
    8192, AR, verify 1..16, draft at 4K context in a cache of DEFAULT_CAPACITY, time vs bytes read vs
    the card's copy bandwidth), with the model's step times beside the measured ones; `profile`: 6
    layers with kernel profiles instead. --smoke runs the same code with the smoke shapes on the CPU."""
    import contextlib
    import gc
    import io

    import torch

    from flashdesk.engine.model.known_models import shapes as synthetic_shapes
    from flashdesk.engine.cli.main import main as cli_main

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    argv = ["bench", "--synthetic", "--json", "--device", device.type] + (["--profile"] if profile else [])
    if smoke:
        argv += ["--layers", "6", "--context", "24", "--prefill-lengths", "8,16"]
        shapes = synthetic_shapes(*smoke_configs())
    else:
        argv += [
            "--layers",
            "6" if profile else "30",
            "--context",
            "4096",
            "--capacity",
            str(DEFAULT_CAPACITY),
            "--repeats",
            "3",
        ]
        shapes = contextlib.nullcontext()
    captured = io.StringIO()
    try:
        with shapes, contextlib.redirect_stdout(captured):
            code = cli_main(argv)
    finally:
        lines = captured.getvalue().strip().splitlines()
        print("\n".join(lines[:-1] if lines and lines[-1].startswith("{") else lines), flush=True)
    if code != 0 or not lines or not lines[-1].startswith("{"):
        return {"ok": False, "error": f"flashdesk bench --synthetic exited {code}", "argv": argv}
    report = json.loads(lines[-1])
    steps = report["steps"]
    ok = all(step["seconds"] and step["bytes"] for step in steps if "skipped" not in step.get("note", ""))
    out = {"ok": ok, "argv": argv, "report": report}
    if not profile:
        out["model_vs_measured"] = model_vs_measured(device, smoke, report)
        for row in out["model_vs_measured"].get("steps", []):
            print(
                f"{row['step']:<10} measured {row['measured_ms']:.3f} ms, modeled {row['modeled_ms']:.3f} ms "
                f"(measured / modeled {row['measured_over_modeled']})",
                flush=True,
            )
    return out


def model_vs_measured(device, smoke: bool, report: dict) -> dict:
    """The performance model's ar, verify-16 and draft times for this card at the bench's capacity
    and length (kernels.check --perf's model: this card's compiled rows, the steps' launch lists
    recorded under the interpreter in a subprocess) beside the measured ones. Not on the smoke run:
    its shapes are not the model's."""
    import subprocess

    import torch

    from flashdesk.kernels import check, perf_model

    if smoke or device.type != "cuda":
        return {"skipped": "the model is of the real shapes on a GPU"}
    major, minor = torch.cuda.get_device_capability(device)
    card = perf_model.card_for(f"sm_{10 * major + minor}")
    if card is None:
        return {"skipped": f"no card of sm_{10 * major + minor} in perf_model.CARDS"}
    rows = check.check([card.arch], perf=True)
    code = (
        "import json, sys; from flashdesk.engine.bench.step_launches import record_steps; "
        f"json.dump(record_steps((({report['capacity']}, {report['context']}),)), sys.stdout)"
    )
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if run.returncode:
        return {"error": run.stderr[-2000:]}
    modeled = perf_model.model_steps(rows, json.loads(run.stdout), [card])
    return {"card": card.name, "label": perf_model.MODEL_LABEL, "steps": compare_steps(modeled, report["steps"])}


def compare_steps(modeled: list[dict], measured: list[dict]) -> list[dict]:
    """Rows of step, modeled_ms, measured_ms, measured_over_modeled for the steps both have (a
    modeled step is measured under its MEASURED_AS name)."""
    seconds = {step["name"]: step["seconds"] for step in measured if step.get("seconds")}
    out = []
    for row in modeled:
        name = MEASURED_AS.get(row["step"], row["step"])
        if name in seconds:
            out.append(
                {
                    "step": name,
                    "launches": row["launches"],
                    "bytes": row["bytes"],
                    "floor_ms": round(1000 * row["floor_seconds"], 3),
                    "modeled_ms": round(1000 * row["modeled_seconds"], 3),
                    "measured_ms": round(1000 * seconds[name], 3),
                    "measured_over_modeled": round(seconds[name] / row["modeled_seconds"], 2),
                }
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--smoke", action="store_true", help="small shapes on the CPU (tests this script)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=540.0,
        help="seconds after which the script prints every thread's stack and exits (default 540: "
        "inside the device tool's 600 s per command, so a hang still returns its results)",
    )
    args = parser.parse_args()
    import_flashdesk()
    import torch

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    smoke = args.smoke or device.type == "cpu"
    out_file = Path(args.out) / "gpu_check.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    results = {}
    sections = [
        ("environment", lambda: section_environment(device)),
        ("kernel_self_tests", lambda: section_kernel_self_tests(device, smoke)),
        ("tiny_correctness", lambda: section_tiny_correctness(device, smoke)),
        ("synthetic_bench", lambda: section_synthetic_bench(device, smoke)),
        (
            "full_size",
            lambda: section_full_size(device, smoke, ("float32",) if device.type == "cpu" else ("fp8", "bfloat16")),
        ),
        ("compiled_kernels", section_compiled_kernels),
        # last: kernel profiles attach CUPTI to CUDA graph replays, which has crashed some CUDA
        # versions (pytorch/pytorch#112507); a crash there costs nothing else
        (
            "kernel_profiles",
            lambda: (
                {"skipped": "profiles are a GPU's"}
                if device.type != "cuda"
                else section_synthetic_bench(device, smoke, profile=True)
            ),
        ),
    ]
    for name, run in sections:
        # written before and after each section: a hang or a crash still leaves what finished, and
        # names the section it stopped in
        results[name] = {"error": f"did not finish (crashed, or --deadline {args.deadline:g} s passed)"}
        out_file.write_text(json.dumps(results, indent=1))
        t0 = time.perf_counter()
        try:
            results[name] = run()
        except Exception as exc:  # noqa: BLE001 - record and go on to the next section
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"== {name}\n{json.dumps(results[name], indent=1)}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    out_file.write_text(json.dumps(results, indent=1))
    failed = [name for name, r in results.items() if "error" in r or r.get("ok") is False]
    print("FAILED: " + ", ".join(failed) if failed else "all sections ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
