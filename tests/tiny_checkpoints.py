"""Tiny Gemma 4 checkpoints in the exact on-disk formats of the real ones, written by transformers.

Every weight is random, including norms, layer_scalar and the router's scale vectors (none left at
1), so a mistake in any of them shows up in the logits. The config keeps every feature the 26B-A4B
uses: sliding and full layers with different head dims and KV head counts, k_eq_v, proportional
partial RoPE, dense MLP plus MoE, final softcap.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_TEXT_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    sliding_window=8,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
    enable_moe_block=True,
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=24,
    hidden_size_per_layer_input=0,
    num_kv_shared_layers=0,
    final_logit_softcapping=30.0,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    use_bidirectional_attention="vision",
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)

TINY_VISION_CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    patch_size=4,
    position_embedding_size=64,
)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter and buffer of the text model a random value, none left at 0 or 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if not tensor.is_floating_point() or "inv_freq" in name or "embed_scale" in name:
                continue
            if (
                name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale"))
                or "layernorm" in name
            ):
                tensor.copy_(0.6 + 0.8 * torch.rand(tensor.shape, generator=gen))
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.15)


def build_reference(layout: str = "conditional", seed: int = 0, **overrides):
    """A randomized transformers Gemma 4 model: the independent reference our engine must match."""
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig

    text = dict(TINY_TEXT_CONFIG, **overrides)
    if layout == "conditional":
        config = Gemma4Config(
            text_config=text,
            vision_config=dict(TINY_VISION_CONFIG),
            audio_config=None,
            eos_token_id=[1, 106],
            tie_word_embeddings=True,
        )
        model = Gemma4ForConditionalGeneration(config)
    elif layout == "causal":
        model = Gemma4ForCausalLM(Gemma4TextConfig(**text))
    else:
        raise ValueError(layout)
    model.config._attn_implementation = "eager"
    randomize(model, seed)
    return model.eval()


def write_checkpoint(
    folder: Path,
    layout: str = "conditional",
    seed: int = 0,
    shard: bool = False,
    dtype: torch.dtype = torch.float32,
    tokenizer: bool = True,
    **overrides,
):
    """Write a tiny checkpoint (config, safetensors, generation config, tokenizer); return the reference."""
    folder = Path(folder)
    model = build_reference(layout, seed, **overrides)
    model.to(dtype).save_pretrained(folder, safe_serialization=True, max_shard_size="200KB" if shard else "1GB")
    (folder / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": 2,
                "eos_token_id": [1, 106, 50],
                "pad_token_id": 0,
                "temperature": 1.0,
                "top_k": 64,
                "top_p": 0.95,
                "do_sample": True,
            }
        )
    )
    if tokenizer:
        from tiny_tokenizer import write_tokenizer

        write_tokenizer(folder)
    return model.to(torch.float32)
