"""A tiny DFlash drafter in z-lab's on-disk layout, and z-lab's reference model loaded from it.

The layout follows z-lab/gemma-4-26B-A4B-it-DFlash (docs/model.md, the DFlash drafter): Qwen3-style
config with `architectures: ["DFlashDraftModel"]`, sliding layers then one full layer,
`dflash_config.{mask_token_id, target_layer_ids}`, weights `fc`, `hidden_norm`, `layers.N.*`, `norm`,
no embedding and no head. Its sliding window is smaller than the tiny target's, so the tests run
past both.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

TINY_DRAFT_CONFIG = dict(
    architectures=["DFlashDraftModel"],
    model_type="qwen3",
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    hidden_act="silu",
    attention_bias=False,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=6,
    use_sliding_window=True,
    max_window_layers=3,
    rope_theta=1_000_000,
    rope_scaling=None,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    vocab_size=512,
    tie_word_embeddings=False,
    block_size=16,
    num_target_layers=6,
    final_logit_softcapping=30.0,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    dtype="float32",
    dflash_config={"mask_token_id": 4, "target_layer_ids": [1, 3, 4]},
)


# The prompts the speculative tests use; the drafter is trained on the target's continuations of
# them (and of a few random ones), as a real drafter is trained on the target's own outputs.
PROMPTS = [[2, 105, 300, 301, 302, 106, 107, 105, 481, 107], [2, 17, 250], [2, 105, 9, 8, 7, 6, 5, 106, 107] * 3]


def write_drafter(
    folder: Path, seed: int = 0, nested_rope: bool = False, target=None, train_steps: int = 300, **overrides
) -> None:
    """Write config.json and model.safetensors of a tiny drafter: random, or briefly trained to
    predict `target`'s greedy continuations (a transformers model) so that drafts get accepted."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    folder = Path(folder)
    raw = dict(TINY_DRAFT_CONFIG, **overrides)
    model = DFlashDraftModel(Qwen3Config(**raw))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.copy_(0.6 + 0.8 * torch.rand(tensor.shape, generator=gen))
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.2)
    if target is not None:
        trained = trained_cache(raw, seed, train_steps, target)
        if trained.is_file():  # trained before with the same inputs and versions
            from safetensors.torch import load_model

            load_model(model, str(trained))
        else:
            train(model, target, train_steps, gen)
            _keep(model, trained)
    model.save_pretrained(folder, safe_serialization=True)
    # the exact z-lab config, not transformers' re-serialization of it
    if nested_rope:
        raw = {k: v for k, v in raw.items() if k != "rope_theta"}
        raw["rope_parameters"] = {"rope_theta": TINY_DRAFT_CONFIG["rope_theta"], "rope_type": "default"}
    (folder / "config.json").write_text(json.dumps(raw, indent=2))


def trained_cache(raw: dict, seed: int, steps: int, target) -> Path:
    """Where a drafter trained on `target` is kept between runs: under a key of everything that
    decides its weights (the config, seed and steps, the target's weights, this file, and the
    torch, transformers and dflash versions). FLASHDESK_TEST_CACHE names the folder."""
    import hashlib
    from importlib import metadata

    digest = hashlib.sha256(
        json.dumps(
            [raw, seed, steps, Path(__file__).read_text()]
            + [metadata.version(name) for name in ("torch", "transformers", "dflash")],
            sort_keys=True,
        ).encode()
    )
    for name, tensor in sorted(target.state_dict().items()):
        digest.update(name.encode() + tensor.detach().float().contiguous().numpy().tobytes())
    root = Path(os.environ.get("FLASHDESK_TEST_CACHE") or Path.home() / ".cache" / "flashdesk" / "test-drafters")
    return root / f"{digest.hexdigest()[:32]}.safetensors"


def _keep(model, path: Path) -> None:
    from safetensors.torch import save_model

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        save_model(model, str(partial))
        partial.replace(path)
    except OSError:
        pass  # a read-only home: the next run trains again


def load_reference_drafter(folder: Path):
    """z-lab's DFlashDraftModel from the folder, told to scale the embedding like Gemma does.

    dflash's PyTorch loop embeds without Gemma's sqrt(hidden) factor; `input_embedding_scale`
    = sqrt(hidden) makes it compute what the drafter is meant to see with a Gemma target.
    """
    from dflash.model import DFlashDraftModel

    model = DFlashDraftModel.from_pretrained(str(folder), torch_dtype=torch.float32)
    model.config.dflash_config = dict(
        model.config.dflash_config, input_embedding_scale=math.sqrt(model.config.hidden_size)
    )
    return model.eval()


def train(model, target, steps: int, gen: torch.Generator) -> None:
    """A few hundred Adam steps on the target's own greedy continuations: DFlash's training task
    (predict the next block-1 tokens from the target's features and the anchor token)."""
    from dflash.model import extract_context_feature

    block = model.block_size
    seqs, feats = [], []
    prompts = [torch.tensor([p]) for p in PROMPTS] + [
        torch.randint(5, model.config.vocab_size, (1, 6), generator=gen) for _ in range(3)
    ]
    with torch.no_grad():
        for prompt in prompts:
            seq = target.generate(prompt, max_new_tokens=50, do_sample=False, eos_token_id=None, pad_token_id=0)
            hidden = target(seq, output_hidden_states=True).hidden_states
            seqs.append(seq[0])
            feats.append(extract_context_feature(hidden, model.target_layer_ids))
    embed = target.get_input_embeddings().weight.detach()
    head = target.get_output_embeddings()
    scale = math.sqrt(model.config.hidden_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        seq, feat = seqs[step % len(seqs)], feats[step % len(seqs)]
        anchor = int(torch.randint(2, len(seq) - block, (1,), generator=gen))
        ids = torch.full((1, block), model.mask_token_id)
        ids[0, 0] = seq[anchor]
        hidden = model(
            target_hidden=feat[:, :anchor],
            noise_embedding=torch.nn.functional.embedding(ids, embed) * scale,
            position_ids=torch.arange(anchor + block)[None],
        )
        logits = model.compute_logits(hidden[:, 1:], head)
        loss = torch.nn.functional.cross_entropy(logits[0], seq[anchor + 1 : anchor + block])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
