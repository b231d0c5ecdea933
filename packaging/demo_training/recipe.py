"""What the demo pair is: its sizes, special tokens, configs and the git revision of our docs it reads.

One place for every constant, so a change of recipe is one diff and the other stages only compute."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]

STDLIB = Path(os.__file__).parent


# Our docs as committed here (README.md, docs/); `--docs-revision worktree` reads the files as they are
DOCS_REVISION = "5a0d5002352b22be81377db7fefaf4982828c2d1"

# A BPE of its own rather than the 512-token test tokenizer (the old random demo's): that one is nearly
# one character a token (1.2-1.3 on our docs and the standard library), this one 2.7-3.6, so in the
# same training time the model reads three times the text and keeps three times as much in view.
VOCAB = 4096

SPECIAL_TOKENS = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    4: "<mask>",
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
}


NEWLINE_ID = 107

BOS, EOS, MASK, TURN_END = 2, 1, 4, 106


TARGET_CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "global_head_dim": 64,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "sliding_window": 128,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
    "enable_moe_block": True,
    "num_experts": 8,
    "top_k_experts": 2,
    # small experts (a quarter of hidden, as in the 26B-A4B): on the CPU the engine gathers each
    # (token, expert) pair's weights, so their size sets what every extra verified token costs
    "moe_intermediate_size": 32,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": BOS,
    "eos_token_id": [EOS, TURN_END],
    "dtype": "bfloat16",
}

# Greedy by default (the app's defaults for a new conversation come from here): a model this small
# is far from sure of its next token, so sampled text wanders off the path its drafter predicts and
# speculation stops paying (at temperature 0.6 it is slower than plain decoding); greedily it pays.
GENERATION_CONFIG = {"bos_token_id": BOS, "eos_token_id": [EOS, TURN_END], "pad_token_id": 0, "do_sample": False}

BLOCK = 16


TAP_LAYERS = [1, 3, 4]  # never the last layer: transformers' last hidden state is after the final norm

DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "hidden_act": "silu",
    "attention_bias": False,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "sliding_window": 64,
    "use_sliding_window": True,
    "max_window_layers": 3,
    "rope_theta": 1_000_000,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
    "block_size": BLOCK,
    "num_target_layers": 6,
    "final_logit_softcapping": 30.0,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": 0,
    "dtype": "bfloat16",
    "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAP_LAYERS},
}


# Gemma 4's chat format (docs/model.md), shared with the tiny test tokenizer and the demo pair
CHAT_TEMPLATE = (ROOT / "assets" / "gemma4_chat_template.jinja").read_text(encoding="utf-8")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
