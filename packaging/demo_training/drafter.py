"""Stage 5, the drafter: z-lab's DFlashDraftModel trained with the DFlash recipe (block-masked
prediction of the target's next tokens from its tapped hidden states)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .recipe import BLOCK, DRAFT_CONFIG, MASK, TAP_LAYERS, TARGET_CONFIG, log, write_json
from .target import lr_at


def block_masks(cfg: dict, anchors: torch.Tensor, width: int) -> list[torch.Tensor]:
    """Per drafter layer, which keys [context positions 0..width-1, then every block's tokens] each block
    token sees: context before its own anchor (within the window on sliding layers), and its own block
    (causally on sliding layers, all of it on the full ones), as the drafter sees them when it drafts."""
    b, n = anchors.shape
    j = torch.arange(BLOCK)
    qpos = (anchors[:, :, None] + j).reshape(b, n * BLOCK)  # absolute position of each query
    qanchor = anchors[:, :, None].expand(b, n, BLOCK).reshape(b, n * BLOCK)
    ctx = torch.arange(width)
    qblock = torch.arange(n).repeat_interleave(BLOCK)
    qj = j.repeat(n)
    same = qblock[:, None] == qblock[None, :]
    masks = []
    for kind in cfg["layer_types"]:
        see_ctx = ctx[None, None, :] < qanchor[:, :, None]
        if kind == "sliding_attention":
            see_ctx &= qpos[:, :, None] - ctx[None, None, :] < cfg["sliding_window"]
            see_block = same & (qj[None, :] <= qj[:, None])
        else:
            see_block = same
        masks.append(torch.cat([see_ctx, see_block[None].expand(b, -1, -1)], dim=-1)[:, None])
    return masks


def draft_forward(drafter, features, embed, ids, anchors, masks, scale):
    """The drafter on many blocks at once; returns the normed hidden states of every block token."""
    b, width = features.shape[:2]
    noise = F.embedding(ids, embed) * scale
    block_pos = (anchors[:, :, None] + torch.arange(BLOCK)).reshape(b, -1)
    positions = torch.cat([torch.arange(width).expand(b, -1), block_pos], dim=1)
    context = drafter.hidden_norm(drafter.fc(features))
    rope = drafter.rotary_emb(noise, positions)
    h = noise
    for layer, mask in zip(drafter.layers, masks):
        h = layer(
            hidden_states=h,
            target_hidden=context,
            attention_mask=mask,
            position_ids=positions,
            position_embeddings=rope,
        )
    return drafter.norm(h)


def build_drafter(seed: int):
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    torch.manual_seed(seed)
    return DFlashDraftModel(Qwen3Config(**{k: v for k, v in DRAFT_CONFIG.items() if k != "dtype"}))


@torch.inference_mode()
def tapped_features(target, seqs: list[list[int]], batch: int) -> list[torch.Tensor]:
    from dflash.model import extract_context_feature

    feats = []
    for b in range(0, len(seqs), batch):
        group = seqs[b : b + batch]
        width = max(map(len, group))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in group])
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states
        tapped = extract_context_feature(hidden, TAP_LAYERS)
        feats += [tapped[i, : len(s)].to(torch.bfloat16) for i, s in enumerate(group)]
    return feats


def train_drafter(
    drafter,
    target,
    data: list[tuple[list[int], int]],
    steps: int,
    batch: int,
    blocks: int,
    seed: int,
    peak_lr: float = 3e-3,
    gamma: float = 7.0,
) -> float:
    log("drafter: the target's hidden states of the replies")
    seqs = [s for s, _ in data]
    feats = tapped_features(target, seqs, 16)
    embed = target.get_input_embeddings().weight.detach()
    head = target.get_output_embeddings()
    for p in target.parameters():
        p.requires_grad_(False)
    scale = math.sqrt(TARGET_CONFIG["hidden_size"])
    weights = torch.exp(-torch.arange(BLOCK - 1) / gamma)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=peak_lr, weight_decay=0.01, betas=(0.9, 0.95))
    drafter.train()
    start, smooth, acc = time.time(), None, None
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup=max(1, steps // 20))
        picks = torch.randint(0, len(data), (batch,), generator=gen).tolist()
        width = max(len(seqs[i]) for i in picks)
        features = torch.zeros(batch, width, feats[0].shape[-1])
        anchors, ids, labels, valid = [], [], [], []
        for row, i in enumerate(picks):
            seq, plen = data[i]
            features[row, : len(seq)] = feats[i].float()
            # anchors where drafting starts: a reply token, the prompt's features before it as context
            choices = torch.arange(plen, len(seq) - 1)
            chosen = choices[torch.randperm(len(choices), generator=gen)[:blocks]]
            chosen = torch.cat([chosen, chosen[:1].expand(blocks - len(chosen))])  # repeats when short
            anchors.append(chosen)
            padded = torch.tensor(seq + [0] * BLOCK)
            block_ids = torch.full((blocks, BLOCK), MASK)
            block_ids[:, 0] = padded[chosen]
            ids.append(block_ids.reshape(-1))
            target_ids = padded[chosen[:, None] + torch.arange(1, BLOCK)]
            labels.append(target_ids)
            valid.append((chosen[:, None] + torch.arange(1, BLOCK)) < len(seq))
        anchors, ids = torch.stack(anchors), torch.stack(ids)
        labels, valid = torch.stack(labels), torch.stack(valid).float()
        masks = block_masks(DRAFT_CONFIG, anchors, width)
        hidden = draft_forward(drafter, features, embed, ids, anchors, masks, scale)
        hidden = hidden.view(batch, blocks, BLOCK, -1)[:, :, 1:]
        logits = drafter.compute_logits(hidden, head)
        loss_each = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        w = valid * weights
        loss = (loss_each.view_as(w) * w).sum() / w.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():  # expected accepted length of a block: leading run of right tokens
            right = ((logits.argmax(-1) == labels) & valid.bool()).int().cumprod(-1).sum(-1).float().mean().item()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        acc = right if acc is None else 0.95 * acc + 0.05 * right
        if step % 25 == 0 or step == steps - 1:
            log(
                f"drafter step {step + 1}/{steps}  loss {smooth:.3f}  accepted per block {acc:.2f}  "
                f"{(step + 1) / (time.time() - start):.2f} steps/s"
            )
    drafter.eval()
    return acc


def save_drafter(drafter, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items() if "rotary_emb" not in k
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_json(folder / "config.json", DRAFT_CONFIG)
