"""4-bit checkpoints: compressed-tensors `pack-quantized` int4, and int4 quantization while loading.

The target users run, cyankiwi/gemma-4-26B-A4B-it-AWQ-4bit, is "AWQ" stored as compressed-tensors
pack-quantized W4A16 (docs/model.md, the 4-bit checkpoint). Per module the checkpoint holds either a plain
`.weight` (left in bf16, e.g. modules in `ignore`) or `.weight_packed` + `.weight_scale`
(+ `.weight_zero_point` when asymmetric, + `.weight_shape`). The key names decide which, and they
also decide the MoE layout: fused 3-D (`experts.gate_up_proj_packed`, gate rows first) or per expert
(`experts.{e}.{gate,up,down}_proj.weight_packed`). Everything becomes `Int4Weight` under the name the
bf16 model uses, so the model code does not care where a weight came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from flashdesk.engine.errors import CheckpointError, ConfigError
from flashdesk.engine.loading.weights import TensorEntry, TensorSpec
from flashdesk.kernels.int4 import Int4Weight, quantize_int4

EXPERT_TENSORS = {"experts.gate_up_proj": ("gate_proj", "up_proj"), "experts.down_proj": ("down_proj",)}
NEVER_QUANTIZED = ("embed_tokens.weight", "router.proj.weight")  # kept in bf16 by every W4A16 recipe


@dataclass(frozen=True)
class Scheme:
    targets: tuple[str, ...]
    group_size: int | None  # None: one group per row (channel strategy)
    symmetric: bool


@dataclass(frozen=True)
class QuantConfig:
    schemes: tuple[Scheme, ...]
    ignore: tuple[str, ...]

    def scheme_for(self, modules: tuple[str, ...], experts: str = "") -> Scheme:
        """The scheme of a packed weight stored as `modules` (one name, or one per expert and
        part; experts: "", "fused" or "per_expert"). As compressed-tensors ranks them: a target
        naming the module exactly, then a `re:` pattern, then a class name; a fused expert tensor
        (experts.gate_up_proj) may also be targeted through its module (experts). Every module of
        one weight must get the same scheme."""
        found = None
        for module in modules:
            scheme = self._scheme_of(module, experts)
            if scheme is None:
                raise CheckpointError(
                    f"{module} is stored quantized but no quantization_config.config_groups entry targets it"
                )
            if found is not None and scheme != found:
                raise CheckpointError(
                    f"{modules[0]} and {module} are parts of one weight but are quantized "
                    f"differently ({_describe(found)} against {_describe(scheme)})"
                )
            found = scheme
        if found is None:
            raise CheckpointError("a packed weight stored as no module at all")
        return found

    def _scheme_of(self, module: str, experts: str) -> Scheme | None:
        names = (module, module.rsplit(".", 1)[0]) if experts == "fused" else (module,)
        for name in names:
            for rank in range(4):
                for scheme in self.schemes:
                    if any(_match_rank(target, name, bool(experts)) == rank for target in scheme.targets):
                        return scheme
        return None

    def ignored(self, module: str, experts: str = "") -> bool:
        return any(_match_rank(pattern, module, bool(experts)) is not None for pattern in self.ignore)


def _match_rank(target: str, module: str, experts: bool) -> int | None:
    """How `target` matches `module`, as compressed-tensors matches them: 0 its exact name, 1 a
    `re:` pattern (re.match, from the start), 2 a class name; None when it does not. We have no
    modules, only names: every packed weight is a Linear (fused experts are stacks of them, and
    vLLM gives them the Linear scheme), and a class name with "Expert" in it (Gemma4TextExperts)
    is an expert module, preferred to Linear for the experts (rank 3)."""
    if target.startswith("re:"):
        return 1 if re.match(target[3:], module) else None
    if target == module:
        return 0
    if "." in target:
        return None
    if experts and "expert" in target.lower():
        return 2
    if target == "Linear":
        return 3 if experts else 2  # an expert class, when a group names one, wins over Linear
    return None


def _describe(scheme: Scheme) -> str:
    group = f"group {scheme.group_size}" if scheme.group_size else "one group per row"
    return f"{group}, {'symmetric' if scheme.symmetric else 'asymmetric'}"


def parse_quant_config(raw: dict, source: str = "config.json") -> QuantConfig | None:
    """The `quantization_config` of a target config, validated; None for an unquantized model."""
    qc = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")
    if not qc:
        return None

    def refuse(what):
        raise ConfigError(
            f"{source}: {what} is not supported; FlashDesk loads compressed-tensors "
            "pack-quantized int4 weights with 16-bit activations (W4A16)"
        )

    method, fmt = qc.get("quant_method"), qc.get("format")
    if method != "compressed-tensors":
        refuse(f"quant_method {method!r}")
    if fmt != "pack-quantized":
        refuse(f"format {fmt!r}")
    schemes = []
    for name, group in (qc.get("config_groups") or {}).items():
        weights, acts = group.get("weights") or {}, group.get("input_activations")
        if acts:
            refuse(f"config group {name}: {acts.get('num_bits', '?')}-bit {acts.get('type', '?')} activations")
        if weights.get("type", "int") != "int":
            refuse(f"config group {name}: {weights.get('num_bits')}-bit {weights['type']} weights (e.g. fp4)")
        if weights.get("num_bits") != 4:
            refuse(f"config group {name}: {weights.get('num_bits')}-bit weights")
        strategy = weights.get("strategy", "group")
        if strategy not in ("group", "channel"):
            refuse(f"config group {name}: the {strategy!r} strategy")
        group_size = int(weights["group_size"]) if strategy == "group" else None
        if group_size is not None and group_size % 8:
            refuse(f"config group {name}: group size {group_size} (not a multiple of 8)")
        schemes.append(
            Scheme(tuple(group.get("targets") or ["Linear"]), group_size, bool(weights.get("symmetric", True)))
        )
    if not schemes:
        raise ConfigError(f"{source}: quantization_config has no config_groups")
    return QuantConfig(tuple(schemes), tuple(qc.get("ignore") or ()))


@dataclass(frozen=True)
class PackedModule:
    """How to build one Int4Weight from checkpoint tensors."""

    dense_name: str  # the name the bf16 model uses, e.g. layers.3.self_attn.q_proj.weight
    parts: tuple[str, ...]  # tensor-name stems: "X.weight_" style, "X_" style, or per-expert stems
    per_expert: int  # 0, or the number of experts stacked from per-expert tensors
    rows_per_part: tuple[int, ...]
    group_size: int
    symmetric: bool


def plan(
    dense: dict[str, tuple[int, ...]], entries: dict[str, TensorEntry], quant: QuantConfig | None
) -> tuple[dict, list[PackedModule]]:
    """The tensors the checkpoint must hold, given which modules its key names say are packed."""
    short, entry = next(iter(entries.items()), ("", None))
    prefix = entry.name.removesuffix(short) if entry else ""  # the layout prefix, e.g. model.language_model.
    specs: dict = {}
    modules: list[PackedModule] = []
    for name, shape in dense.items():
        packed = _packed_layout(name, shape, entries)
        if packed is None:
            specs[name] = TensorSpec(shape)
            continue
        if quant is None:
            raise CheckpointError(f"{name} is stored packed (int4) but config.json has no quantization_config")
        if name.endswith(NEVER_QUANTIZED):
            raise CheckpointError(f"{name} is quantized; FlashDesk needs the embedding and router in 16 bits")
        stems, experts, rows = packed
        kind = ("per_expert" if experts else "fused") if not name.endswith(".weight") else ""
        module = prefix + name.removesuffix(".weight")
        names = tuple(prefix + stem.removesuffix(".weight_") for stem in stems) if experts else (module,)
        ignored = next((n for n in names if quant.ignored(n, kind)), None)
        if ignored:
            raise CheckpointError(f"{ignored} is listed in quantization_config.ignore but stored packed")
        scheme = quant.scheme_for(names, kind)
        in_features = shape[-1]
        group = scheme.group_size or in_features
        if in_features % group or in_features % 8:
            raise CheckpointError(f"{module}: {in_features} inputs do not split into groups of {group}")
        for stem, out in zip(stems, rows):
            lead = (shape[0],) if len(shape) == 3 and not experts else ()
            specs[stem + "packed"] = TensorSpec((*lead, out, in_features // 8), "int32")
            specs[stem + "scale"] = TensorSpec((*lead, out, in_features // group))
            specs[stem + "shape"] = TensorSpec((len(lead) + 2,), "int", optional=True)
            if not scheme.symmetric:
                specs[stem + "zero_point"] = TensorSpec((*lead, -(-out // 8), in_features // group), "int32")
        modules.append(PackedModule(name, stems, experts, rows, group, scheme.symmetric))
    return specs, modules


def _packed_layout(name: str, shape, entries):
    """(tensor stems, experts stacked per expert or 0, output rows of each stem) or None if dense."""
    if name.endswith(".weight") and name.removesuffix("weight") + "weight_packed" in entries:
        return (name.removesuffix("weight") + "weight_",), 0, (shape[0],)
    for key, parts in EXPERT_TENSORS.items():
        if not name.endswith(key):
            continue
        if name + "_packed" in entries:  # fused 3-D
            return (name + "_",), 0, (shape[1],)
        layer = name.removesuffix(key)
        if layer + f"experts.0.{parts[0]}.weight_packed" in entries:  # per expert 2-D
            rows = shape[1] // len(parts)
            stems = tuple(f"{layer}experts.{e}.{p}.weight_" for e in range(shape[0]) for p in parts)
            return stems, shape[0], (rows,) * len(stems)
    return None


def assemble(raw: dict, modules: list[PackedModule]) -> dict:
    """Replace the packed tensors of each module by one Int4Weight under its dense name."""
    for m in modules:
        pieces = []
        for stem in m.parts:
            raw.pop(stem + "shape", None)
            packed, scale = raw.pop(stem + "packed"), raw.pop(stem + "scale")
            zero = raw.pop(stem + "zero_point") if not m.symmetric else None
            rows = packed.shape[-2]
            pieces.append(
                Int4Weight(packed, scale, None if zero is None else unpack_zero_point(zero, rows), m.group_size)
            )
        raw[m.dense_name] = _stack(pieces, m.per_expert)
    return raw


def _stack(pieces: list[Int4Weight], experts: int) -> Int4Weight:
    if len(pieces) == 1:
        return pieces[0]
    per = len(pieces) // experts  # parts per expert (gate and up -> 2)
    rows = [pieces[e * per : (e + 1) * per] for e in range(experts)]

    def stacked(get):
        if get(pieces[0]) is None:
            return None
        return torch.stack([torch.cat([get(p) for p in row]) for row in rows])

    return Int4Weight(
        stacked(lambda p: p.packed), stacked(lambda p: p.scale), stacked(lambda p: p.zero), pieces[0].group_size
    )


def unpack_zero_point(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """Zero points are packed 8 per int32 along the OUTPUT dimension: [..., ceil(rows/8), G] -> int8 [..., rows, G]."""
    t = packed.transpose(-1, -2).contiguous()  # [..., G, ceil(rows/8)]
    nibbles = t.view(torch.uint8)
    q = torch.stack([nibbles & 0xF, nibbles >> 4], dim=-1).flatten(-2)[..., :rows].to(torch.int8) - 8
    return q.transpose(-1, -2).contiguous()


def quantize_on_load(group_size: int = 32):
    """A load_tensors transform: every linear and expert weight to symmetric int4 (round to nearest)."""

    def transform(name: str, tensor: torch.Tensor):
        dense_linear = name.endswith(".weight") and tensor.dim() == 2 and not name.endswith(NEVER_QUANTIZED)
        if (dense_linear or name.endswith(tuple(EXPERT_TENSORS))) and tensor.shape[-1] % group_size == 0:
            return quantize_int4(tensor, group_size)
        return tensor

    return transform
