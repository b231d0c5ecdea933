"""The memory plan: what the target, the drafter, the KV cache and the workspace need on the GPU,
the longest context that fits, and a refusal with the numbers when nothing useful fits.

Every figure mirrors what the engine allocates: weights as loaded (int4 kept packed: int32 words,
scales in the model dtype, unpacked int8 zero points; norms in fp32), the KV cache by the rule
`kv_cache.py` allocates by, the drafter's context cache by `drafter.DraftContext`'s rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from flashdesk.engine.model.config import SLIDING, DraftConfig, Gemma4Config, read_json
from flashdesk.engine.model.assistant import AssistantConfig, assistant_expected_shapes
from flashdesk.engine.errors import FlashDeskError
from flashdesk.engine.model.kv_cache import FP8, STORAGE_DTYPES
from flashdesk.engine.loading.quant import parse_quant_config, plan
from flashdesk.engine.loading.weights import expected_shapes, scan_checkpoint
from flashdesk.kernels.attention import MASK_BYTES_PER_ENTRY, SCORE_MATRICES_AT_PEAK, query_rows_per_pass
from flashdesk.kernels.backend import use_triton

MIN_USEFUL_CONTEXT = 2048
GPU_KV_DTYPE = "fp8"  # what `--kv-dtype auto` picks on CUDA
PREFILL_CHUNK = 1024  # prompt tokens per forward (the decoder's chunks): bounds a prefill's activations
# CUDA context, allocator caching/fragmentation, logits, MLP/MoE activations of a prefill chunk
WORKSPACE_FIXED_BYTES = 1 << 30

# the draft models a plan counts: none, a DFlash drafter or an MTP assistant, or both in a tuple
DraftModels = DraftConfig | AssistantConfig | tuple | None


def kv_cache_bytes(cfg: Gemma4Config, context: int, kv_dtype: str, slack: int = 16) -> int:
    """Bytes `Gemma4.new_cache(context, kv_dtype, slack)` allocates, computed without allocating.

    Full-attention layers hold `context` positions, sliding layers a ring of min(context, window +
    slack); each position holds K and V of num_kv_heads x head_dim in the storage dtype, and for fp8
    one fp32 scale per (position, KV head) for K and one for V.
    """
    if kv_dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown KV storage dtype {kv_dtype!r}; choose from {', '.join(STORAGE_DTYPES)}")
    dtype = STORAGE_DTYPES[kv_dtype]
    element = dtype.itemsize
    scale = 4 if dtype == FP8 else 0  # torch.float32 scales, one for K and one for V
    total = 0
    for layer in cfg.layers:
        positions = min(context, cfg.sliding_window + slack) if layer.sliding else context
        total += positions * 2 * layer.num_kv_heads * (layer.head_dim * element + scale)
    return total


def loaded_weight_bytes(cfg: Gemma4Config, dtype_bytes: int = 2) -> int:
    """Bytes the text model holds on the device when loaded in a `dtype_bytes` dtype (bf16: 2).

    The model keeps its norm weights in fp32 whatever the load dtype (gemma4.py), the rest as loaded.
    """
    return sum(_numel(shape) * (4 if _is_norm(name) else dtype_bytes) for name, shape in expected_shapes(cfg).items())


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight") or "layernorm" in name


def workspace_bytes(
    cfg: Gemma4Config,
    context: int,
    chunk: int = PREFILL_CHUNK,
    dtype_bytes: int = 2,
    kv_dtype: str = GPU_KV_DTYPE,
    triton: bool = True,
) -> int:
    """The activation/workspace allowance at `context` tokens: a fixed 1 GiB plus the attention of
    the worst prefill chunk (`chunk` queries over all `context` keys), on the layer where it peaks.

    On the Triton path (a GPU's) the prefill kernel allocates no scores and reads a full layer's
    keys where the cache stores them when they are fp8 or in the compute dtype (another dtype comes
    back converted); a sliding layer's visible keys are read back in the compute dtype (its window
    is joined to the new block). The plain-torch attention
    (kernels/attention.py, `triton=False`) runs in passes of as many query rows as its score budget
    allows: the [heads, rows, keys] fp32 scores are alive twice at once (masked in place, then
    softmaxed) beside the [rows, keys] bool masks, and every layer's keys stored otherwise than in
    the compute dtype (fp8) are read back in it.
    """
    chunk = max(1, min(chunk, context))
    storage = STORAGE_DTYPES[kv_dtype].itemsize if kv_dtype in STORAGE_DTYPES else 1
    converted = kv_dtype not in STORAGE_DTYPES or storage != dtype_bytes
    attn = 0
    for layer in cfg.layers:
        keys = min(context, cfg.sliding_window - 1 + chunk) if layer.sliding else context
        rows = min(chunk, query_rows_per_pass(cfg.num_heads, keys))
        scores = (
            0
            if triton
            else int(SCORE_MATRICES_AT_PEAK * cfg.num_heads * rows * keys * 4) + rows * keys * MASK_BYTES_PER_ENTRY
        )
        read_back = layer.sliding or (converted and not (triton and kv_dtype == "fp8"))  # fp8: read in place
        elements = keys * layer.num_kv_heads * layer.head_dim
        held = 2 * elements * dtype_bytes if read_back else 0
        converting = elements * (2 * dtype_bytes + 4) if converted and read_back else 0  # K, then V in fp32, cast
        attn = max(attn, held + scores, converting)
    return WORKSPACE_FIXED_BYTES + attn


def format_bytes(n: int | float) -> str:
    """Human-readable binary size: 512 B, 3.5 KiB, 12.0 MiB, 47.02 GiB."""
    if n < 1024:
        return f"{int(n)} B"
    for unit, div in (("KiB", 1024), ("MiB", 1024**2)):
        if n < div * 1024:
            return f"{n / div:.1f} {unit}"
    return f"{n / 1024**3:.2f} GiB"


class OutOfMemoryPlan(FlashDeskError):
    """The models do not fit in the GPU memory that is free."""


def _numel(shape) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def planned_weight_bytes(specs: dict, modules, dtype_bytes: int = 2) -> int:
    """Device bytes of a checkpoint's target weights from its tensor plan (`quant.plan`).

    Packed int4 stays int32 words; zero points unpack to int8, one per row and group; norms are
    held in fp32; every other float tensor in the model dtype; `weight_shape` is read and dropped.
    """
    zero_rows = {stem + "zero_point": rows for m in modules for stem, rows in zip(m.parts, m.rows_per_part)}
    total = 0
    for name, spec in specs.items():
        if spec.optional:
            continue
        if name in zero_rows:
            total += _numel(spec.shape[:-2]) * zero_rows[name] * spec.shape[-1]
        elif spec.kind == "int32":
            total += _numel(spec.shape) * 4
        else:
            total += _numel(spec.shape) * (4 if _is_norm(name) else dtype_bytes)
    return total


def int4_weight_bytes(cfg: Gemma4Config, group_size: int = 32, dtype_bytes: int = 2) -> int:
    """Device bytes with every linear and expert weight in symmetric int4 (embedding and routers
    in 16 bits): what `--quantize int4` produces, and the layout of the 4-bit checkpoints."""
    total = 0
    for name, shape in expected_shapes(cfg).items():
        packable = (
            name.endswith(".weight")
            and len(shape) == 2
            and not _is_norm(name)
            and not name.endswith(("embed_tokens.weight", "router.proj.weight"))
        ) or name.endswith(("experts.gate_up_proj", "experts.down_proj"))
        if packable and shape[-1] % group_size == 0:
            total += _numel(shape) // 2 + _numel(shape) // group_size * dtype_bytes
        else:
            total += _numel(shape) * (4 if _is_norm(name) else dtype_bytes)
    return total


def drafter_weight_bytes(cfg: DraftConfig | AssistantConfig, dtype_bytes: int = 2) -> int:
    if isinstance(cfg, AssistantConfig):  # every tensor in the compute dtype, the token ordering as int64
        shapes = assistant_expected_shapes(cfg)
        return sum(
            _numel(shape) * (8 if name.endswith("token_ordering") else dtype_bytes) for name, shape in shapes.items()
        )
    d, dh = cfg.hidden_size, cfg.head_dim
    per_layer = (
        2 * d + cfg.num_heads * dh * d * 2 + cfg.num_kv_heads * dh * d * 2 + 2 * dh + 3 * cfg.intermediate_size * d
    )
    return (d * len(cfg.target_layer_ids) * d + 2 * d + cfg.num_layers * per_layer) * dtype_bytes


def drafter_context_bytes(cfg: DraftConfig | AssistantConfig, context: int, dtype_bytes: int = 2) -> int:
    """DraftContext: full layers hold every position, sliding layers a ring of the window, each
    with room for one draft block beyond (written there and attended in place). An MTP assistant
    keeps no context: it attends over the target's cache."""
    if isinstance(cfg, AssistantConfig):
        return 0
    total = 0
    held = context + cfg.block_size
    for kind in cfg.layer_kinds:
        positions = (
            held if kind != SLIDING or cfg.sliding_window is None else min(held, cfg.sliding_window + cfg.block_size)
        )
        total += positions * 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    return total


@dataclass(frozen=True)
class MemoryPlan:
    context: int
    target_bytes: int
    drafter_bytes: int  # the DFlash drafter's weights
    kv_bytes: int
    draft_context_bytes: int
    workspace_bytes: int
    kv_dtype: str
    assistant_bytes: int = 0  # the MTP assistant's weights (it keeps no context of its own)

    @property
    def total(self) -> int:
        draft = self.drafter_bytes + self.draft_context_bytes + self.assistant_bytes
        return self.target_bytes + self.kv_bytes + draft + self.workspace_bytes

    def lines(self) -> list[str]:
        g = format_bytes
        parts = [f"target {g(self.target_bytes)}", f"KV ({self.kv_dtype}) {g(self.kv_bytes)}"]
        if self.drafter_bytes:
            parts += [f"drafter {g(self.drafter_bytes)}", f"drafter context {g(self.draft_context_bytes)}"]
        if self.assistant_bytes:
            parts.append(f"assistant {g(self.assistant_bytes)}")
        parts.append(f"workspace {g(self.workspace_bytes)}")
        return [f"{g(self.total)} at {self.context} tokens", "= " + " + ".join(parts)]


def plan_memory(
    cfg: Gemma4Config,
    target_bytes: int,
    context: int,
    kv_dtype: str,
    draft: DraftModels = None,
    dtype_bytes: int = 2,
    triton: bool | None = None,
) -> MemoryPlan:
    """Everything the engine holds on the device at `context` tokens, for a compute dtype of
    `dtype_bytes` (bf16 on the GPU) and its kernels (`triton`; by default what a GPU runs here:
    Triton, unless FLASHDESK_KERNELS=torch). Nothing else grows with the context: the drafter's
    context is built chunk by chunk during prefill, and kept conversations live in host memory."""
    if triton is None:
        triton = use_triton(torch.device("cuda"), "prefill_attention")
    drafters = [d for d in _drafts(draft) if isinstance(d, DraftConfig)]
    assistants = [d for d in _drafts(draft) if isinstance(d, AssistantConfig)]
    slack = max([16] + [d.block_size for d in drafters])
    return MemoryPlan(
        context=context,
        target_bytes=target_bytes,
        drafter_bytes=sum(drafter_weight_bytes(d, dtype_bytes) for d in drafters),
        kv_bytes=kv_cache_bytes(cfg, context, kv_dtype, slack),
        draft_context_bytes=sum(drafter_context_bytes(d, context, dtype_bytes) for d in drafters),
        workspace_bytes=workspace_bytes(cfg, context, dtype_bytes=dtype_bytes, kv_dtype=kv_dtype, triton=triton),
        kv_dtype=kv_dtype,
        assistant_bytes=sum(drafter_weight_bytes(d, dtype_bytes) for d in assistants),
    )


def _drafts(draft) -> tuple:
    """The draft models' configs: none, one, or a tuple (a DFlash drafter and an MTP assistant)."""
    if draft is None:
        return ()
    return tuple(draft) if isinstance(draft, (tuple, list)) else (draft,)


def longest_context(cfg: Gemma4Config, target_bytes: int, kv_dtype: str, free: int, draft: DraftModels = None) -> int:
    """The largest context (up to the model's limit) whose plan fits in `free` bytes; 0 if none."""
    lo, hi = 0, cfg.max_position_embeddings
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_memory(cfg, target_bytes, mid, kv_dtype, draft).total <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(
    cfg: Gemma4Config,
    target_bytes: int,
    context: int | None,
    kv_dtype: str,
    free: int,
    draft: DraftModels = None,
    quantized: bool = True,
) -> int:
    """The context to run at: `context` if it fits, else the longest that fits when none was asked.

    Raises OutOfMemoryPlan naming what is needed, what is free, and what to change.
    """
    best = longest_context(cfg, target_bytes, kv_dtype, free, draft)
    want = context or min(cfg.max_position_embeddings, max(best, MIN_USEFUL_CONTEXT))
    plan = plan_memory(cfg, target_bytes, want, kv_dtype, draft)
    if plan.total <= free:
        return want
    g = format_bytes
    advice = []
    if best >= MIN_USEFUL_CONTEXT:
        advice.append(f"a context of at most {best} tokens (--context {best})")
    if kv_dtype != "fp8":
        advice.append("an fp8 KV cache (--kv-dtype fp8)")
    if not quantized:
        advice.append("int4 weights (--quantize int4 or the 4-bit checkpoint)")
    if plan.drafter_bytes:
        advice.append(f"no drafter (saves {g(plan.drafter_bytes + plan.draft_context_bytes)})")
    if plan.assistant_bytes:
        advice.append(f"no assistant (saves {g(plan.assistant_bytes)})")
    advice.append("closing other programs that use the GPU")
    raise OutOfMemoryPlan(
        f"not enough GPU memory: {g(plan.total)} needed at {want} tokens ({'; '.join(plan.lines()[1:])}), "
        f"{g(free)} free. Try " + ", or ".join(advice) + "."
    )


def target_weight_bytes(model_dir, cfg: Gemma4Config, quantize: str | None, dtype_bytes: int = 2) -> tuple[int, bool]:
    """(device bytes of the target's weights, whether they are int4) for a checkpoint folder."""
    if quantize:
        return int4_weight_bytes(cfg, dtype_bytes=dtype_bytes), True
    quant = parse_quant_config(read_json(Path(model_dir) / "config.json", "model config"))
    specs, packed = plan(expected_shapes(cfg), scan_checkpoint(model_dir), quant)
    return planned_weight_bytes(specs, packed, dtype_bytes), bool(packed)


def context_that_fits(
    model_dir,
    cfg: Gemma4Config,
    draft: DraftModels,
    kv_dtype: str,
    context: int | None,
    quantize: str | None,
    free: int,
    dtype_bytes: int = 2,
) -> int:
    """Before loading on a GPU: the context to allocate for, or OutOfMemoryPlan with the numbers."""
    weights, quantized = target_weight_bytes(model_dir, cfg, quantize, dtype_bytes)
    return check_fits(cfg, weights, context, kv_dtype, free, draft, quantized)
