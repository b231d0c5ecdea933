"""The demo model: a tiny random Gemma 4 target and DFlash drafter, written to disk in seconds.

Why: every part of the app (streaming, speculation statistics, telemetry, storage) should work on
a machine without a GPU or downloaded weights, and the app's tests drive the real worker with it.
The target's weights are random, so the text is meaningless; the folders are in the exact on-disk layouts
of the real checkpoints (a `Gemma4ForCausalLM` config.json and safetensors, z-lab's drafter config,
the tokenizer files shipped in assets/demo_tokenizer/), and names and shapes come from the loaders'
own `expected_shapes` / `draft_expected_shapes`, so the engine loads them by its normal path.
No transformers or dflash is needed.

The drafter is built by hand rather than trained: it proposes "the last token again" at every
draft position. A random target, decoding greedily, repeats itself a good deal, so some drafts
are accepted and some not, and the speculation panel has real, varying numbers to show. How: the
target's embedding carries a constant marker in dimension MARK for every token but the drafter's
mask token, which carries a constant in dimension QUERY instead; in the drafter's full-attention
layer every mask position's query reads QUERY and every key reads MARK, so all mask positions
attend to the anchor, and the values copy half of the anchor's embedding into the residual, whose
logits through the tied head favour the anchor. The other layers are identities (zero weights).

    python -m flashdesk.engine.hub.demo FOLDER     # writes FOLDER/target and FOLDER/drafter
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from flashdesk.engine.model.config import parse_config, parse_draft_config
from flashdesk.engine.model.drafter import draft_expected_shapes
from flashdesk.engine.loading.weights import expected_shapes

TOKENIZER_ASSETS = Path(__file__).resolve().parents[2] / "assets" / "demo_tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MARKER = "flashdesk-demo.json"  # written last: a folder without it is incomplete
DEMO_VERSION = 1

TARGET_CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "sliding_window": 8,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
    "enable_moe_block": True,
    "num_experts": 8,
    "top_k_experts": 2,
    "moe_intermediate_size": 24,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "dtype": "bfloat16",
}

# Greedy decoding of a random model soon repeats one token for ever (every draft accepted); at 0.6
# it wanders and repeats in bursts, so the acceptance statistics vary as with a real model.
GENERATION_CONFIG = {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0, "do_sample": True,
                     "temperature": 0.6, "top_k": 64, "top_p": 0.95}

DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "hidden_act": "silu",
    "attention_bias": False,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "sliding_window": 6,
    "use_sliding_window": True,
    "max_window_layers": 3,
    "rope_theta": 1_000_000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "vocab_size": 512,
    "tie_word_embeddings": False,
    "block_size": 16,
    "num_target_layers": 6,
    "final_logit_softcapping": 30.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "dtype": "bfloat16",
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 3, 4]},
}

MASK_ID = DRAFT_CONFIG["dflash_config"]["mask_token_id"]
MARK, QUERY = 63, 62  # embedding dimensions that route the drafter's attention (see the docstring)
MARK_VALUE = 0.3
STD = 0.15
QUIET_SCALE = 0.2  # byte-fallback, placeholder and special tokens: picked rarely, so the text reads as words
QK_GAIN = 2.5  # q_norm / k_norm weight of the copying layer: the anchor wins by about e^25
COPY_GAIN = 4.0

# Scale-like tensors get values around 1 (none exactly 1), everything else small normal noise.
_SCALES = ("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if name.endswith(_SCALES) or "layernorm" in name:
        return 0.6 + 0.8 * torch.rand(shape, generator=gen)
    return torch.randn(shape, generator=gen) * STD


def _quiet_ids(folder: Path) -> list[int]:
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    quiet = [i for token, i in vocab.items() if token.startswith(("<0x", "<unused"))]
    added = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["added_tokens_decoder"]
    return sorted(set(quiet) | ({int(i) for i in added} - {1}))  # <eos> keeps its weight


def _embedding(shape: tuple[int, ...], quiet: list[int], gen: torch.Generator) -> torch.Tensor:
    embed = torch.randn(shape, generator=gen) * STD
    embed[quiet] *= QUIET_SCALE
    embed[:, MARK] = MARK_VALUE
    embed[MASK_ID] = 0.0
    embed[MASK_ID, QUERY] = STD
    return embed


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def write_target(folder: Path, seed: int = 0) -> None:
    """config.json, generation_config.json, model.safetensors (as transformers names a
    Gemma4ForCausalLM's tensors: `model.` + the text model's names) and the tokenizer files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_ASSETS / name, folder / name)
    shapes = expected_shapes(parse_config(TARGET_CONFIG))
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: _random_tensor(name, shape, gen) for name, shape in sorted(shapes.items())}
    tensors["embed_tokens.weight"] = _embedding(shapes["embed_tokens.weight"], _quiet_ids(folder), gen)
    _save({f"model.{name}": t for name, t in tensors.items()}, folder / "model.safetensors")
    _write_json(folder / "config.json", TARGET_CONFIG)
    _write_json(folder / "generation_config.json", GENERATION_CONFIG)


def write_drafter(folder: Path) -> None:
    """config.json and model.safetensors in z-lab's layout (no embedding, no head): the copying
    drafter described in the module docstring."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = parse_draft_config(DRAFT_CONFIG)
    shapes = draft_expected_shapes(cfg)
    tensors = {name: torch.ones(shape) if name.endswith("norm.weight") else torch.zeros(shape)
               for name, shape in shapes.items()}
    dh, last = cfg.head_dim, cfg.num_layers - 1
    p = f"layers.{last}.self_attn."
    for head in range(cfg.num_heads):  # every query reads QUERY into its last dimension
        tensors[p + "q_proj.weight"][head * dh + dh - 1, QUERY] = 1.0
    for group in range(cfg.num_kv_heads):  # every key reads MARK; values copy dimensions 0..31
        tensors[p + "k_proj.weight"][group * dh + dh - 1, MARK] = 1.0
        for j in range(dh):
            tensors[p + "v_proj.weight"][group * dh + j, group * dh + j] = 1.0
    tensors[p + "q_norm.weight"].fill_(QK_GAIN)
    tensors[p + "k_norm.weight"].fill_(QK_GAIN)
    heads_per_group = cfg.num_heads // cfg.num_kv_heads
    for group in range(cfg.num_kv_heads):  # the first head of each group writes its values back
        head = group * heads_per_group
        for j in range(dh):
            tensors[p + "o_proj.weight"][group * dh + j, head * dh + j] = COPY_GAIN
    _save(tensors, folder / "model.safetensors")
    _write_json(folder / "config.json", DRAFT_CONFIG)


def demo_paths(folder: str | Path) -> tuple[Path, Path]:
    folder = Path(folder)
    return folder / "target", folder / "drafter"


def is_complete(folder: str | Path) -> bool:
    marker = Path(folder) / MARKER
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("version") == DEMO_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def create_demo(folder: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Write the demo pair under `folder` unless a complete one is there; return (target, drafter)."""
    folder = Path(folder)
    target, drafter = demo_paths(folder)
    if is_complete(folder) and not force:
        return target, drafter
    for part in (target, drafter):
        if part.exists():
            shutil.rmtree(part)
    write_target(target)
    write_drafter(drafter)
    _write_json(folder / MARKER, {"version": DEMO_VERSION,
                                  "note": "random weights: FlashDesk's demo model writes meaningless text"})
    return target, drafter


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m flashdesk.engine.hub.demo FOLDER", file=sys.stderr)
        return 2
    target, drafter = create_demo(argv[0])
    print(f"target  {target}\ndrafter {drafter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
