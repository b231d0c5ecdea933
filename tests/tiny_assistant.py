"""Tiny Gemma 4 MTP assistants built by transformers (Gemma4AssistantForCausalLM) for the tiny target,
saved in the real on-disk format (config.json with its text_config, model.safetensors): the
independent reference the engine's assistant must match."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_checkpoints import TINY_TEXT_CONFIG, randomize

ASSISTANT_HIDDEN = 48


def build_assistant(
    seed: int = 0, ordered: bool = False, centroids: int = 16, top_k: int = 4, hidden: int = ASSISTANT_HIDDEN
):
    """A randomized assistant for the tiny target: two layers (sliding, full) whose query heads attend
    over the target's K/V geometry of each kind; with `ordered`, a random token ordering."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

    text = dict(
        TINY_TEXT_CONFIG,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        enable_moe_block=False,
        vocab_size_per_layer_input=0,
        use_double_wide_mlp=False,
    )
    config = Gemma4AssistantConfig(
        text_config=Gemma4TextConfig(**text),
        backbone_hidden_size=TINY_TEXT_CONFIG["hidden_size"],
        use_ordered_embeddings=ordered,
        num_centroids=centroids,
        centroid_intermediate_top_k=top_k,
    )
    model = Gemma4AssistantForCausalLM(config)
    model.config._attn_implementation = "eager"
    randomize(model, seed)
    if ordered:
        order = torch.randperm(text["vocab_size"], generator=torch.Generator().manual_seed(seed))
        model.masked_embedding.token_ordering.copy_(order)
    return model.eval()


def write_assistant(folder: Path, seed: int = 0, ordered: bool = False):
    """Save the assistant as its checkpoint would be; return the transformers model."""
    model = build_assistant(seed, ordered)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def write_echo_assistant(folder: Path, target, seed: int = 0):
    """An assistant that mostly proposes the last token again (the target's width, its embedding as
    the head, the token's embedding passed through, small attention and MLP outputs on top): random
    tiny targets repeat tokens, so some drafts are accepted and every path of a round runs."""
    model = build_assistant(seed, hidden=TINY_TEXT_CONFIG["hidden_size"])
    d = TINY_TEXT_CONFIG["hidden_size"]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        model.pre_projection.weight.zero_()
        model.pre_projection.weight[:, :d].copy_(torch.eye(d))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    model.save_pretrained(folder, safe_serialization=True)
    return model
