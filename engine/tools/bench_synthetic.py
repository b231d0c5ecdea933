"""`flashdesk bench --synthetic`: full-size step timings against the bytes each step must read.

No checkpoint and no download: the exact Gemma 4 26B-A4B and z-lab DFlash drafter shapes
(MODEL-SPEC.md sections 1 and 4) are filled with random weights generated on the device, int4
group-32 symmetric where the real W4A16 checkpoint is int4 (every attention and MLP linear and the
experts), bf16 where it is not (tied embedding / head, routers, norms, scalars). `--layers N` keeps
the first N decoder layers (the last kept one is full attention, as the config parser makes it),
with the drafter's target_layer_ids remapped into range.

Steps timed (PERFORMANCE-MODEL.md sections 0-2 give the byte model):
- prefill-1024, prefill-8192: a forward of that many tokens from an empty cache of its own (the
  names stay when `--prefill-lengths` shrinks them for a CPU run; on the CPU one longer than
  --context is skipped with a note, on a GPU both always run);
- ar: one token at --context tokens of context, logits of the last row;
- verify-1 .. verify-16: m tokens at --context, logits of every row, then rolled back;
- draft: the drafter's block of 15 after its context holds --context positions
  (+ draft-int4 when the drafter accepts quantize="int4").

Each step's bytes: the non-expert weights it touches (fused linears as stored, int4 counted as
packed + scales (+ zeros), norms, routers, scalars), the embedding rows of its tokens, the whole
head (any logits read all of it), the UNION of experts the routers actually picked in that step
(recorded by wrapping the MoE call the model makes), and the KV it reads (per layer: the positions
visible to the block's last query x KV heads x head_dim x 2 x bytes per element, + fp8 scales).
The draft step reads the drafter's layers, final norm, head and its context K/V (fc and hidden_norm
belong to add_context, which is not in the timed step). On a GPU the card's copy bandwidth gives
floor_seconds = bytes / bandwidth and the fraction of that floor each step reaches.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from flashdesk.kernels.int4 import weight_nbytes

REAL_LAYERS = 30
LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 5
REAL_TARGET = {  # google/gemma-4-26B-A4B-it text config (MODEL-SPEC.md section 1)
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": 262144,
    "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": REAL_LAYERS, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
    "attention_k_eq_v": True, "attention_bias": False, "sliding_window": 1024, "layer_types": LAYER_TYPES,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}},
    "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
    "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": 30.0, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "eos_token_id": [1, 106], "bos_token_id": 2, "pad_token_id": 0,
    "dtype": "bfloat16"}
REAL_DRAFTER = {  # z-lab/gemma-4-26B-A4B-it-DFlash config.json (MODEL-SPEC.md section 4)
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 2816, "num_hidden_layers": 5,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 5632,
    "hidden_act": "silu", "attention_bias": False,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048,
    "use_sliding_window": True, "max_window_layers": 5, "rope_theta": 1000000, "rope_scaling": None,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "vocab_size": 262144, "tie_word_embeddings": False,
    "block_size": 16, "num_target_layers": REAL_LAYERS, "final_logit_softcapping": 30.0, "bos_token_id": 2,
    "eos_token_id": 1, "pad_token_id": 0, "dtype": "bfloat16", "use_cache": True,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 6, 11, 17, 22, 27]}}

GROUP = 32
DRAFT_K = 15
VERIFY_LENGTHS = tuple(range(1, 17))
PREFILL_NAMES = ("prefill-1024", "prefill-8192")
GPU_CONTEXT, CPU_CONTEXT = 4096, 256
FILL_CHUNK = 1024
COPY_BYTES = 1 << 30
TARGETS = {"ar_floor_fraction": 0.70, "verify16_over_ar": 2.0, "draft_over_ar": 0.35}


# --- configs --------------------------------------------------------------------------------------

@contextmanager
def shapes(target: dict, drafter: dict):
    """Run with other (smaller) raw configs in place of the real ones: tests and CPU smoke runs."""
    global REAL_TARGET, REAL_DRAFTER
    saved = REAL_TARGET, REAL_DRAFTER
    REAL_TARGET, REAL_DRAFTER = target, drafter
    try:
        yield
    finally:
        REAL_TARGET, REAL_DRAFTER = saved


def remap_layer_ids(ids, num_layers: int, real_layers: int = REAL_LAYERS) -> list[int]:
    """The drafter's tapped layers scaled from the real 30 onto the first num_layers (in range)."""
    if num_layers >= real_layers:
        return [min(i, num_layers - 1) for i in ids]
    return [min(num_layers - 1, round(i * (num_layers - 1) / (real_layers - 1))) for i in ids]


def target_raw(layers: int = REAL_LAYERS) -> dict:
    if not 1 <= layers <= REAL_LAYERS:
        raise ValueError(f"--layers must be 1..{REAL_LAYERS}, got {layers}")
    types = list(LAYER_TYPES[:layers])
    if "full_attention" not in types:
        types[-1] = "full_attention"  # at least one full layer (parse_config forces the last one anyway)
    return dict(REAL_TARGET, num_hidden_layers=layers, layer_types=types)


def draft_raw(layers: int = REAL_LAYERS) -> dict:
    ids = remap_layer_ids(REAL_DRAFTER["dflash_config"]["target_layer_ids"], layers)
    return dict(REAL_DRAFTER, num_target_layers=layers,
                dflash_config=dict(REAL_DRAFTER["dflash_config"], target_layer_ids=ids))


# --- random weights on the device -----------------------------------------------------------------

def _generator(device, seed: int):
    device = torch.device(device)
    return None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)


def random_int4(shape, device, dtype, gen) -> "Int4Weight":
    """Uniform nibbles (q in -8..7), scale 1/sqrt(fan_in)/4: outputs of about the inputs' size."""
    from flashdesk.kernels.int4 import Int4Weight

    *lead, fan_in = shape
    packed = torch.randint(-2**31, 2**31, (*lead, fan_in // 8), dtype=torch.int32, device=device, generator=gen)
    scale = torch.full((*lead, fan_in // GROUP), 0.25 / math.sqrt(fan_in), dtype=dtype, device=device)
    return Int4Weight(packed, scale, None, GROUP)


def _randn(shape, std, device, dtype, gen, mean=0.0):
    """Normal values written straight into the one tensor (no fp32 temporary, no second copy)."""
    return torch.empty(shape, dtype=dtype, device=device).normal_(mean, std, generator=gen)


def random_target_weights(cfg, device, dtype, seed: int = 0) -> dict:
    """Every tensor the model pops (weights.expected_shapes): int4 linears/experts, 16-bit the rest.
    On the "meta" device nothing is allocated (byte counting of the full model in tests)."""
    from flashdesk.engine.loading.weights import expected_shapes

    gen = _generator(device, seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if name == "embed_tokens.weight":  # tied head: logits of std ~1 on normalized states
            weights[name] = _randn(shape, 0.02, device, dtype, gen)
        elif name.endswith("router.proj.weight"):  # router logits of std ~1: routing well spread
            weights[name] = _randn(shape, 1.0, device, dtype, gen)
        elif name.endswith("layer_scalar"):
            weights[name] = torch.ones(shape, dtype=dtype, device=device)
        elif len(shape) == 1:  # norms, router scale, per-expert scale
            weights[name] = _randn(shape, 0.05, device, dtype, gen, mean=1.0)
        elif shape[-1] % GROUP == 0:  # attention and MLP linears, experts
            weights[name] = random_int4(shape, device, dtype, gen)
        else:
            weights[name] = _randn(shape, 1 / math.sqrt(shape[-1]), device, dtype, gen)
    return weights


def random_draft_weights(dcfg, device, dtype, seed: int = 1) -> dict:
    """The drafter as z-lab ships it: 16-bit linears (1/sqrt(fan_in)), norms ~1."""
    from flashdesk.engine.model.drafter import draft_expected_shapes

    gen = _generator(device, seed)
    return {name: (_randn(shape, 0.05, device, dtype, gen, mean=1.0) if len(shape) == 1 else
                   _randn(shape, 1 / math.sqrt(shape[-1]), device, dtype, gen))
            for name, shape in draft_expected_shapes(dcfg).items()}


def drafter_supports_int4() -> bool:
    from flashdesk.engine.model.drafter import Drafter

    return "quantize" in inspect.signature(Drafter).parameters


# --- bytes ----------------------------------------------------------------------------------------

KV_ELEMENT_BYTES = {"fp8": 1, "bfloat16": 2, "float32": 4}
FP8_SCALE_BYTES = 4  # one fp32 scale per (token, KV head), for K and for V


def kv_read_bytes(cfg, kv_dtype: str, start: int, t: int) -> int:
    """KV bytes a forward of t tokens at positions start.. reads: per layer, every key its last query
    sees (full layers: all start + t; sliding: the window, the block's own keys included)."""
    elem = KV_ELEMENT_BYTES[kv_dtype]
    end = start + t
    total = 0
    for spec in cfg.layers:
        lo = max(0, start - cfg.sliding_window + 1) if spec.sliding else 0
        positions = end - lo
        per_position = spec.num_kv_heads * spec.head_dim * elem * 2
        if kv_dtype == "fp8":
            per_position += spec.num_kv_heads * FP8_SCALE_BYTES * 2
        total += positions * per_position
    return total


def draft_kv_bytes(dcfg, context: int, element_size: int) -> int:
    """Context K/V a draft step reads: all of it on full layers, the last window - 1 on sliding ones."""
    total = 0
    for kind in dcfg.layer_kinds:
        held = context if kind != "sliding_attention" or dcfg.sliding_window is None else \
            min(context, dcfg.sliding_window - 1)
        total += held * dcfg.num_kv_heads * dcfg.head_dim * 2 * element_size
    return total


EXPERT_ATTRS = ("experts_gate_up", "experts_down")


def layer_dense_bytes(layer) -> int:
    """Everything a decoder layer holds except the experts (read whole by every forward)."""
    return sum(weight_nbytes(value) for name, value in vars(layer).items() if name not in EXPERT_ATTRS)


def expert_bytes(layer) -> int:
    """Bytes of ONE expert of this layer (its gate_up and down slices)."""
    gate_up, down = getattr(layer, "experts_gate_up", None), getattr(layer, "experts_down", None)
    if gate_up is None:
        return 0
    return (weight_nbytes(gate_up) + weight_nbytes(down)) // gate_up.shape[0]


@dataclass
class Bytes:
    """What one step reads, by kind."""

    weights: int = 0  # non-expert weights, norms, routers, embedding rows
    experts: int = 0  # the union of experts hit
    head: int = 0
    kv: int = 0
    experts_per_layer: float | None = None  # mean union size over the MoE layers

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.head + self.kv

    def as_dict(self) -> dict:
        return {"weights": self.weights, "experts": self.experts, "head": self.head, "kv": self.kv}


def target_step_bytes(model, kv_dtype: str, start: int, t: int, unique_ids: int,
                      experts_hit: dict[int, int] | None) -> Bytes:
    """Bytes of model.forward over t tokens at start (any logits rows: the head is read whole).

    experts_hit: layer index -> number of distinct experts routed to in this step."""
    b = Bytes()
    b.weights = sum(layer_dense_bytes(layer) for layer in model.layers) + weight_nbytes(model.final_norm)
    b.weights += unique_ids * model.embed.shape[1] * model.embed.element_size()
    b.head = weight_nbytes(model.embed)
    moe_layers = [i for i, layer in enumerate(model.layers) if expert_bytes(layer)]
    if moe_layers:
        hit = experts_hit or {}
        b.experts = sum(hit.get(i, 0) * expert_bytes(model.layers[i]) for i in moe_layers)
        b.experts_per_layer = sum(hit.get(i, 0) for i in moe_layers) / len(moe_layers)
    b.kv = kv_read_bytes(model.cfg, kv_dtype, start, t)
    return b


def draft_step_bytes(drafter, context: int) -> Bytes:
    """Bytes of drafter.draft_logits: its layers, final norm, the head it drafts with, context K/V
    (not fc / hidden_norm: add_context reads those, outside the timed step)."""
    b = Bytes()
    b.weights = sum(weight_nbytes(layer) for layer in drafter.layers) + weight_nbytes(drafter.norm)
    embed = drafter.target.embed
    b.weights += 2 * embed.shape[1] * embed.element_size()  # the block's rows: anchor and mask
    b.head = weight_nbytes(getattr(drafter, "head", embed))
    b.kv = draft_kv_bytes(drafter.cfg, context, torch.empty((), dtype=drafter.dtype).element_size())
    return b


# --- routing record -------------------------------------------------------------------------------

class RouterRecorder:
    """Wraps the MoE call of flashdesk.engine.model.gemma4 to keep each layer's router logits
    (a reference, nothing computed in the timed step); `union` takes their top-k afterwards."""

    def __init__(self, model):
        self.layer_of = {id(layer.experts_gate_up): i for i, layer in enumerate(model.layers)
                         if getattr(layer, "experts_gate_up", None) is not None}
        self.moe_layers = sorted(self.layer_of.values())
        self.calls: list[tuple[int | None, torch.Tensor, int]] = []

    @contextmanager
    def active(self):
        from flashdesk.engine.model import gemma4

        original = gemma4.routed_moe

        def recording(x, gate_up, down, logits, top_k, *args, **kwargs):
            self.calls.append((self.layer_of.get(id(gate_up)), logits, top_k))
            return original(x, gate_up, down, logits, top_k, *args, **kwargs)

        gemma4.routed_moe = recording
        try:
            yield self
        finally:
            gemma4.routed_moe = original

    def reset(self) -> None:
        self.calls = []

    def union(self) -> dict[int, int] | None:
        """Layer -> distinct experts over every call since reset (None if the MoE call was not seen):
        each token's top-k of its logits (the softmax keeps their order)."""
        if not self.calls:
            return None
        ids: dict[int, list] = {}
        for n, (layer, logits, top_k) in enumerate(self.calls):
            if layer is None and self.moe_layers:  # experts not passed as stored: layers run in order
                layer = self.moe_layers[n % len(self.moe_layers)]
            ids.setdefault(layer, []).append(torch.topk(logits.float(), top_k, dim=-1).indices.reshape(-1))
        return {layer: int(torch.unique(torch.cat(parts)).numel()) for layer, parts in ids.items()}


# --- timing ---------------------------------------------------------------------------------------

def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(device, fn, warmup: int, repeats: int, before=None, after=None) -> float:
    """Median seconds of fn(); before/after (cache set-up, rollback) run outside the timed region."""
    samples = []
    for i in range(warmup + repeats):
        if before:
            before()
        _sync(device)
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        if after:
            after()
        if i >= warmup:
            samples.append(seconds)
    return statistics.median(samples)


def copy_bandwidth(device, nbytes: int = COPY_BYTES, repeats: int = 5) -> float | None:
    """Bytes per second of a device-to-device copy (read + written), or None off the GPU."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_step(device, lambda: dst.copy_(src), warmup=2, repeats=repeats)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


# --- the run --------------------------------------------------------------------------------------

@dataclass
class Step:
    name: str
    seconds: float | None
    bytes: Bytes | None
    tokens: int = 0
    note: str | None = None

    def floor(self, bandwidth: float | None) -> float | None:
        return self.bytes.total / bandwidth if bandwidth and self.bytes else None

    def as_dict(self, bandwidth: float | None) -> dict:
        floor = self.floor(bandwidth)
        row = {"name": self.name, "seconds": self.seconds, "bytes": self.bytes.total if self.bytes else None,
               "floor_seconds": floor, "tokens": self.tokens,
               "floor_fraction": floor / self.seconds if floor and self.seconds else None,
               "bytes_by_kind": self.bytes.as_dict() if self.bytes else None,
               "experts_per_layer": self.bytes.experts_per_layer if self.bytes else None}
        if self.note:
            row["note"] = self.note
        return row


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return device


def _dtype(name: str, device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32  # bf16 matmuls crawl on CPUs
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _kv_dtype(name: str, device, dtype) -> str:
    if name in (None, "auto"):
        return "fp8" if device.type == "cuda" else ("float32" if dtype == torch.float32 else "bfloat16")
    return name


def parse_prefill_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--prefill-lengths must be two comma-separated integers, got {text!r}") from None
    if len(lengths) != len(PREFILL_NAMES) or min(lengths) < 1:
        raise ValueError(f"--prefill-lengths needs {len(PREFILL_NAMES)} positive lengths "
                         f"(for {', '.join(PREFILL_NAMES)}), got {text!r}")
    return lengths


def run_synthetic(layers: int = REAL_LAYERS, context: int | None = None, device: str = "auto",
                  dtype: str = "auto", kv_dtype: str = "auto", prefill_lengths=(1024, 8192),
                  repeats: int | None = None, seed: int = 0, log=None) -> dict:
    """Build the synthetic model on the device, time every step, and return the report dict."""
    from flashdesk.engine.decode.kernel_warmup import compile_generation_kernels
    from flashdesk.engine.model.config import check_pair, parse_config, parse_draft_config
    from flashdesk.engine.model.drafter import Drafter
    from flashdesk.engine.model.gemma4 import Gemma4
    from flashdesk.kernels.backend import describe

    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    dev = _device(device)
    torch_dtype = _dtype(dtype, dev)
    kv = _kv_dtype(kv_dtype, dev, torch_dtype)
    gpu = dev.type == "cuda"
    context = context if context is not None else (GPU_CONTEXT if gpu else CPU_CONTEXT)
    if context < 1:
        raise ValueError(f"--context must be at least 1, got {context}")
    repeats = repeats if repeats is not None else (5 if gpu else 1)
    warmup = 1 if gpu else 0
    prefill_repeats = max(1, min(repeats, 3))
    cfg, dcfg = parse_config(target_raw(layers)), parse_draft_config(draft_raw(layers))
    check_pair(cfg, dcfg, "synthetic drafter")
    taps = tuple(dcfg.target_layer_ids)

    t0 = time.perf_counter()
    bandwidth = copy_bandwidth(dev)
    model = Gemma4(cfg, random_target_weights(cfg, dev, torch_dtype, seed), dev, torch_dtype)
    drafter = Drafter(dcfg, random_draft_weights(dcfg, dev, torch_dtype, seed + 1), model)
    _sync(dev)
    log(f"synthetic Gemma 4 26B-A4B, {layers} layer(s), {torch_dtype} on {dev}, KV {kv}: "
        f"built in {time.perf_counter() - t0:.1f} s")
    gen = torch.Generator(device=dev).manual_seed(seed + 7)

    def tokens(n):
        return torch.randint(5, cfg.vocab_size, (n,), device=dev, generator=gen)

    # the context's cache and drafter context, allocated first: the kernels compile ahead over them
    cache = model.new_cache(context + VERIFY_LENGTHS[-1], kv)
    dctx = drafter.new_context(context + DRAFT_K + 1)
    took = compile_generation_kernels(model, cache, drafter, dctx)
    compiled = None if took is None else f"kernels compiled ahead in {took:.1f} s on {os.cpu_count()} cores"
    if compiled:
        log(compiled)
    recorder = RouterRecorder(model)
    steps: list[Step] = []
    with recorder.active():
        # prefill from an empty cache
        for name, length in zip(PREFILL_NAMES, prefill_lengths):
            if length > context and not gpu:  # a small CPU run; a GPU prefills from its own cache regardless
                steps.append(Step(name, None, None, length, f"skipped: {length} tokens exceed --context {context}"))
                log(f"{name}: skipped ({length} > context {context})")
                continue
            ids = tokens(length)
            holder = {}

            def fresh(length=length):
                holder["cache"] = model.new_cache(length, kv)
                recorder.reset()

            seconds = time_step(dev, lambda ids=ids: model.forward(ids, holder["cache"], logits_rows="last"),
                                warmup, prefill_repeats, before=fresh)
            holder.clear()
            steps.append(Step(name, seconds, target_step_bytes(
                model, kv, 0, length, _unique(ids), recorder.union()), length))
            log(f"{name}: {1000 * seconds:.1f} ms")

        # the context, once: target cache and drafter context side by side
        tap_chunks = []
        t0 = time.perf_counter()
        chunk = FILL_CHUNK if gpu else max(context, 1)
        for begin in range(0, context, chunk):
            out = model.forward(tokens(min(chunk, context - begin)), cache, taps=taps, logits_rows="last")
            drafter.add_context(dctx, out.taps)
            tap_chunks.append(out.taps)
        _sync(dev)
        log(f"context of {context} tokens filled in {time.perf_counter() - t0:.1f} s")

        def target_step(name, m, logits_rows):
            ids = tokens(m)
            seconds = time_step(dev, lambda: model.forward(ids, cache, logits_rows=logits_rows), warmup, repeats,
                                before=recorder.reset, after=lambda: cache.rollback(context))
            step = Step(name, seconds, target_step_bytes(model, kv, context, m, _unique(ids), recorder.union()), m)
            log(f"{name}: {1000 * seconds:.1f} ms")
            return step

        steps.append(target_step("ar", 1, "last"))
        for m in VERIFY_LENGTHS:
            steps.append(target_step(f"verify-{m}", m, "all"))

    anchor = tokens(1)

    def draft_step(name, d, ctx):
        seconds = time_step(dev, lambda: d.draft_logits(ctx, anchor, DRAFT_K), warmup, repeats)
        log(f"{name}: {1000 * seconds:.1f} ms")
        return Step(name, seconds, draft_step_bytes(d, context), DRAFT_K + 1)

    steps.append(draft_step("draft", drafter, dctx))
    notes = [compiled] if compiled else []
    if drafter_supports_int4():
        del dctx
        drafter = None
        drafter = Drafter(dcfg, random_draft_weights(dcfg, dev, torch_dtype, seed + 1), model, quantize="int4")
        ctx4 = drafter.new_context(context + DRAFT_K + 1)
        for taps_chunk in tap_chunks:
            drafter.add_context(ctx4, taps_chunk)
        steps.append(draft_step("draft-int4", drafter, ctx4))
    else:
        notes.append("draft-int4 skipped: Drafter has no quantize option")
    if cfg.enable_moe and any(step.bytes and step.bytes.experts_per_layer is None and step.name.startswith(
            ("prefill", "ar", "verify")) for step in steps):
        notes.append("the MoE call was not observed: expert bytes of some steps are missing")

    return _report(dev, layers, context, kv, torch_dtype, bandwidth, steps, notes, describe(dev))


def _unique(ids: torch.Tensor) -> int:
    return int(torch.unique(ids).numel())


def _report(dev, layers, context, kv, dtype, bandwidth, steps, notes, kernels) -> dict:
    by_name = {step.name: step for step in steps}

    def ratio(a, b):
        sa, sb = by_name.get(a), by_name.get(b)
        return sa.seconds / sb.seconds if sa and sb and sa.seconds and sb.seconds else None

    ar = by_name["ar"]
    ar_floor = ar.floor(bandwidth)
    ratios = {"verify16_over_ar": ratio("verify-16", "ar"), "draft_over_ar": ratio("draft", "ar"),
              "ar_floor_fraction": ar_floor / ar.seconds if ar_floor and ar.seconds else None}
    if "draft-int4" in by_name:
        ratios["draft_int4_over_ar"] = ratio("draft-int4", "ar")
    targets = None
    if dev.type == "cuda":
        targets = {
            "ar_at_least_70pct_of_floor": ratios["ar_floor_fraction"] is not None
            and ratios["ar_floor_fraction"] >= TARGETS["ar_floor_fraction"],
            "verify16_at_most_2x_ar": ratios["verify16_over_ar"] is not None
            and ratios["verify16_over_ar"] <= TARGETS["verify16_over_ar"],
            "draft_at_most_0.35x_ar": ratios["draft_over_ar"] is not None
            and ratios["draft_over_ar"] <= TARGETS["draft_over_ar"],
        }
    return {
        "device": str(dev) if dev.type != "cuda" else f"cuda ({torch.cuda.get_device_name(dev)})",
        "layers": layers, "context": context, "dtype": str(dtype).removeprefix("torch."), "kv_dtype": kv,
        "kernels": kernels, "bandwidth_gbps": bandwidth / 1e9 if bandwidth else None,
        "steps": [step.as_dict(bandwidth) for step in steps], "ratios": ratios, "targets": targets,
        "notes": notes,
    }


# --- output ---------------------------------------------------------------------------------------

def format_table(report: dict) -> str:
    def num(value, fmt):
        return format(value, fmt) if value is not None else "-"

    lines = [f"synthetic Gemma 4 26B-A4B + DFlash: {report['layers']} layer(s), context {report['context']}, "
             f"{report['dtype']}, KV {report['kv_dtype']}, kernels {report['kernels']}, {report['device']}",
             "copy bandwidth: " + (f"{report['bandwidth_gbps']:.0f} GB/s" if report["bandwidth_gbps"]
                                   else "n/a (no floor on the CPU)"),
             f"{'step':<14}{'ms':>10}{'MB read':>11}{'GB/s':>9}{'of floor':>10}{'experts/layer':>15}"]
    for row in report["steps"]:
        gbps = row["bytes"] / row["seconds"] / 1e9 if row["bytes"] and row["seconds"] else None
        frac = row["floor_fraction"]
        lines.append(f"{row['name']:<14}{num(row['seconds'] and 1000 * row['seconds'], '.2f'):>10}"
                     f"{num(row['bytes'] and row['bytes'] / 1e6, '.1f'):>11}{num(gbps, '.1f'):>9}"
                     f"{num(frac and 100 * frac, '.0f') + ('%' if frac else ''):>10}"
                     f"{num(row['experts_per_layer'], '.1f'):>15}" + (f"  ({row['note']})" if row.get("note") else ""))
    r = report["ratios"]
    lines.append(f"verify(16) / AR = {num(r['verify16_over_ar'], '.2f')}, draft / AR = {num(r['draft_over_ar'], '.2f')}"
                 + (f", draft-int4 / AR = {num(r['draft_int4_over_ar'], '.2f')}" if "draft_int4_over_ar" in r else "")
                 + f", AR at {num(r['ar_floor_fraction'] and 100 * r['ar_floor_fraction'], '.0f')}% of its floor")
    if report["targets"] is not None:
        for label, key in (("AR >= 70% of floor", "ar_at_least_70pct_of_floor"),
                           ("verify(16) <= 2x AR", "verify16_at_most_2x_ar"),
                           ("draft <= 0.35x AR", "draft_at_most_0.35x_ar")):
            lines.append(f"target {label}: {'met' if report['targets'][key] else 'not met'}")
    lines.extend(f"note: {note}" for note in report["notes"])
    return "\n".join(lines)


def run_synthetic_bench(args) -> int:
    """The CLI entry: `flashdesk bench --synthetic ...`."""
    lengths = parse_prefill_lengths(args.prefill_lengths)
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    report = run_synthetic(layers=args.layers, context=args.context, device=args.device, dtype=args.dtype,
                           kv_dtype=args.kv_dtype, prefill_lengths=lengths, repeats=args.repeats)
    print(format_table(report), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 0
