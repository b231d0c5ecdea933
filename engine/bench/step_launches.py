"""The launch list of each decode step at the real shapes: what the performance model costs.

A step is recorded on the CPU with the kernels counted, not run (kernels/launch_log.launch_list),
on the synthetic Gemma 4 26B-A4B over its first two layers (one sliding, one full) at the real
cache capacity and a filled length, and the full-size DFlash drafter in int4 (a GPU's default,
`--draft-quantize auto`). Triton launches take the options an sm_90 or later card gives them
(programmatic dependent launch; the model applies it where an arch's compiled rows have it).
Launches inside the sliding layer count 25 times, inside the full layer 5 times, the rest
(embedding, head) once: the 30-layer step. Every launch gets the bytes it moves, from its tensor
arguments:
- weights: an argument that is (a view of) a weight is read whole, an expert tensor only for the
  experts the step routes to (8 for one token; for a 16-token block, the expected union under
  uniform routing, ~82 of 128, the near-uniform end that published verify costs imply);
- KV: a cache or drafter context read by attention is read over the positions the block sees
  (its scales likewise); a cache written by a K/V store moves the block's rows;
- activations: every other tensor argument, whole, but decode attention's per-split partials:
  the splits that ran.
`read_bytes` (weights and KV read) is the step's floor, as engine/bench/step_bytes counts it.

`record_steps` is registered as the `flashdesk.step_launches` entry point: `python -m
flashdesk.kernels.check --perf` models these steps without kernels/ importing the engine.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from flashdesk.kernels.int4 import Int4Weight
from flashdesk.kernels.backend import spec_key
from flashdesk.kernels.launch_log import as_on_gpu, launch_list

STEPS = ("ar", "verify-16", "draft")
DEFAULT_POINTS = ((262144, 4096), (8192, 4096))  # (capacity, length)
REAL_SLIDING, REAL_FULL = 25, 5
DRAFT_K = 15
ATTENTION_READS = ("_decode_split_kernel",)
SPLIT_PARTIALS = ("_decode_split_kernel", "_decode_combine_kernel")  # they move only the splits that ran
PARTIALS = ("m_ptr", "l_ptr", "acc_ptr")


def expected_union(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts `tokens` tokens route to, each picking top_k of `experts` uniformly."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Int4Weight):
        yield from (t for t in (obj.packed, obj.scale, obj.zero) if t is not None)
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


class _Storage:
    """What each storage holds: weights (expert tensors marked), KV (caches and drafter contexts)."""

    def __init__(self, model, drafter, cache, ctx):
        self.kind: dict[int, tuple[str, bool]] = {}
        for holder in (model, *model.layers, drafter, *getattr(drafter, "layers", ())):
            for name, value in holder.items() if isinstance(holder, dict) else vars(holder).items():
                if name in ("target", "layers", "cfg"):
                    continue
                for t in _tensors(value):
                    self.kind[_ptr(t)] = ("weights", name.startswith("experts"))
        for t, _ in cache.buffers() + ctx.buffers():
            self.kind[_ptr(t)] = ("kv", False)

    def of(self, t: torch.Tensor) -> tuple[str, bool]:
        return self.kind.get(_ptr(t), ("activations", False))


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _key_range(launch: dict, start: int) -> tuple[int, int]:
    """First and last key position a decode-attention launch reads."""
    s = launch["scalars"]
    return max(start - s["window"] + 1, 0), start + s["T"] - 1


def _visible(launch: dict, start: int) -> int:
    lo, hi = _key_range(launch, start)
    return hi - lo + 1


def _splits_run(launch: dict, start: int) -> int:
    """Split columns of a decode-attention launch that hold the block's keys (the others exit)."""
    lo, hi = _key_range(launch, start)
    split = launch["scalars"]["split"]
    return min(launch["scalars"]["P"], hi // split - lo // split + 1)


def _working_programs(launch: dict, start: int) -> int:
    """Programs that do work: a decode-attention program whose split lies past the block's keys
    exits at once (its grid is fixed by the cache's capacity)."""
    if launch["function"] not in ATTENTION_READS:
        return launch.get("programs", 1)
    return launch["grid"][0] * _splits_run(launch, start)


def _launch_bytes(
    launch: dict, storage: _Storage, start: int, expert_share: float, early: tuple = ()
) -> tuple[int, int, int]:
    """(bytes moved, bytes read of weights and KV, of those the bytes of the arguments `early`) by
    one launch."""
    moved = read = early_read = 0
    largest: dict[int, tuple[str, torch.Tensor]] = {}  # one tensor per storage: an unused stand-in aliases another
    for name, t in launch["tensors"].items():
        if _ptr(t) not in largest or _nbytes(t) > _nbytes(largest[_ptr(t)][1]):
            largest[_ptr(t)] = name, t
    for name, t in largest.values():
        kind, expert = storage.of(t)
        size = _nbytes(t)
        if launch["function"] in SPLIT_PARTIALS and name in PARTIALS:  # [P, ...]: the splits that ran
            size = size * _splits_run(launch, start) // t.shape[0]
        if kind == "weights" and launch["function"] == "aten.embedding.default":
            size = _nbytes(launch["tensors"]["arg2"])  # the rows it gathers: as many bytes as it returns
            read += size
        elif kind == "weights" and launch["function"] == "_embed_norm_kernel" and name == "table_ptr":
            size = _nbytes(launch["tensors"]["h_ptr"])  # the rows it gathers: as many bytes as h
            read += size
        elif kind == "weights":
            size = round(size * expert_share) if expert else size
            read += size
            early_read += size if name in early else 0
        elif kind == "kv":
            rows = t.shape[0]
            if launch["function"] in ATTENTION_READS:
                size = size * min(rows, _visible(launch, start)) // rows
                read += size
            else:  # a store: the block's rows
                size = size * launch.get("scalars", {}).get("T", 1) // rows
        moved += size
    return moved, read, early_read


def _costed(kernels: list[dict], storage: _Storage, start: int, expert_share: float, counts: list[int]) -> list[dict]:
    out = []
    for launch, count in zip(kernels, counts):
        module = __import__(launch["module"], fromlist=[launch["function"]]) if "signature" in launch else None
        early = getattr(module, "PREFETCHED", {}).get(launch["function"], ())  # asked of L2 whole before the wait
        moved, read, early_read = _launch_bytes(launch, storage, start, expert_share, early)
        entry = {
            "function": launch["function"],
            "count": count,
            "bytes": moved,
            "read_bytes": read,
            "programs": _working_programs(launch, start),
            "key": None,
            "pdl": launch.get("pdl", False),
        }
        if "signature" in launch:  # a Triton launch: the key of the compiled spec it runs
            fn = getattr(module, launch["function"])
            if early_read:
                entry["prefetch_bytes"] = early_read
                entry["prefetch_some"] = launch["function"] in getattr(module, "PREFETCHED_BY_SOME", ())
                first = getattr(module, "PREFETCHING_PROGRAMS", {}).get(launch["function"])
                if first:  # only the grid's first programs ask
                    entry["prefetch_programs"] = first(launch)
            tail = getattr(module, "TAILS", {}).get(launch["function"])
            if tail:  # a fused kernel whose last program runs a chain after the others
                spec, passes = tail(launch)
                entry["tail"] = repr(
                    spec_key(spec.fn, spec.signature, spec.constexprs, spec.num_warps, spec.num_stages, spec.maxnreg)
                )
                entry["tail_passes"] = passes
            entry["key"] = repr(
                spec_key(
                    fn,
                    launch["signature"],
                    as_on_gpu(launch),
                    launch["num_warps"],
                    launch["num_stages"],
                    launch.get("maxnreg"),
                )
            )
        out.append(entry)
    return out


@contextmanager
def _layer_marks(model, marks: list, launched: list):
    """Note (layer index, index of its first launch) as each target layer starts."""
    original = model._layer

    def marked(i, *args, **kwargs):
        marks.append((i, len(launched)))
        return original(i, *args, **kwargs)

    model._layer = marked
    try:
        yield
    finally:
        del model._layer


def _counts(model, n: int, marks: list[tuple[int, int]], layer_end: int) -> list[int]:
    """Each launch's count in the 30-layer step: the sliding layer's 25, the full layer's 5."""
    counts = [1] * n
    bounds = marks + [(None, layer_end)]
    for (layer, begin), (_, end) in zip(bounds, bounds[1:]):
        times = REAL_SLIDING if model.cfg.layers[layer].sliding else REAL_FULL
        counts[begin:end] = [times] * (end - begin)
    return counts


def _last_layer_end(launched: list[dict], marks: list) -> int:
    """Where the last layer's launches end: its fused output norm (the final norm) is its last
    kernel; after it come the head linear and the softcap."""
    for i in range(len(launched) - 1, marks[-1][1] - 1, -1):
        if launched[i]["function"] == "_mlp_out_kernel":
            return i + 1
    return len(launched)


def record_step(model, drafter, cache, ctx, step: str, real_layers: bool = True) -> list[dict]:
    """The costed launches of one step at the cache's and context's length. real_layers: each
    launch counted as often as the 30-layer model runs it; else once (the model as it is)."""
    from flashdesk.kernels.backend import kernels, recording_pdl

    rows = {"ar": 1, "verify-16": 16, "draft": DRAFT_K + 1}[step]
    cfg = model.cfg
    marks: list[tuple[int, int]] = []  # (layer, its first launch)
    ids = torch.arange(5, 5 + rows)  # a step's tokens come from the step before: made outside the record
    last = torch.tensor([7])
    with (
        kernels("triton"),
        recording_pdl(),
        torch.inference_mode(),
        launch_list() as launched,
        _layer_marks(model, marks, launched),
    ):
        if step == "draft":
            drafter.draft_logits(ctx, last, DRAFT_K)
        else:
            model.compute(ids, cache, tuple(drafter.cfg.target_layer_ids), "all")
    counts = [1] * len(launched)
    if real_layers and step != "draft":
        counts = _counts(model, len(launched), marks, _last_layer_end(launched, marks))
    share = expected_union(cfg.num_experts, cfg.top_k_experts, rows) / cfg.num_experts if cfg.num_experts else 0
    costed = _costed(launched, _Storage(model, drafter, cache, ctx), cache.length, share, counts)
    return _first_layer_apart(costed) if real_layers and step != "draft" else costed


def _first_layer_apart(launches: list[dict]) -> list[dict]:
    """The sliding layer's launches once, then again for the other 24: the model costs a launch
    after the one before it in the list (what that one leaves idle, whether it released this one
    early), and only the first layer follows the embedding; the others follow a layer's last
    kernel."""
    first = next((i for i, launch in enumerate(launches) if launch["count"] == REAL_SLIDING), None)
    if first is None:
        return launches
    end = next((i for i in range(first, len(launches)) if launches[i]["count"] != REAL_SLIDING), len(launches))
    layer = launches[first:end]
    return (
        launches[:first]
        + [launch | {"count": 1} for launch in layer]
        + [launch | {"count": REAL_SLIDING - 1} for launch in layer]
        + launches[end:]
    )


def record_steps(points=DEFAULT_POINTS, kv_dtype: str = "fp8", draft_quantize: str | None = "int4") -> list[dict]:
    """One entry per (step, capacity, length): step, capacity, length, launches (costed, counted
    for the 30-layer model)."""
    from flashdesk.engine.bench.synthetic_model import synthetic_pair

    model, drafter = synthetic_pair(2, "cpu", torch.bfloat16, quantize=draft_quantize)
    if [s.sliding for s in model.cfg.layers] != [True, False]:
        raise RuntimeError("the synthetic two-layer model is no longer one sliding and one full layer")
    out = []
    warm = model.new_cache(64, kv_dtype)
    record_step(model, drafter, warm, drafter.new_context(64), "ar")  # one-time allocations are no step's
    for capacity, length in points:
        cache, ctx = model.new_cache(capacity, kv_dtype), drafter.new_context(capacity)
        cache.place(length, length)
        ctx.place(length, length)
        out += [
            {
                "step": step,
                "capacity": capacity,
                "length": length,
                "launches": record_step(model, drafter, cache, ctx, step),
            }
            for step in STEPS
        ]
    return out
