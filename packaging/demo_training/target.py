"""Stage 3, the target: transformers' Gemma4ForCausalLM at toy size, trained as a language model, saved
in bf16 as the engine loads it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .recipe import GENERATION_CONFIG, TARGET_CONFIG, log, write_json


def build_target():
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    raw = {k: v for k, v in TARGET_CONFIG.items() if k not in ("architectures", "model_type", "dtype")}
    model = Gemma4ForCausalLM(Gemma4TextConfig(**raw))
    model.config._attn_implementation = "sdpa"
    return model


class Windows:
    """Random training windows from two token streams: plain text and chat conversations."""

    def __init__(self, plain: list[list[int]], chats: list[list[int]], chat_share: float, length: int, seed: int):
        self.streams = [torch.tensor([t for doc in plain for t in doc]), torch.tensor([t for c in chats for t in c])]
        self.share, self.length = chat_share, length
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, size: int) -> torch.Tensor:
        rows = []
        for _ in range(size):
            stream = self.streams[int(torch.rand((), generator=self.gen) < self.share)]
            start = int(torch.randint(0, len(stream) - self.length - 1, (), generator=self.gen))
            rows.append(stream[start : start + self.length + 1])
        return torch.stack(rows)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_target(model, windows: Windows, steps: int, batch: int, peak_lr: float = 3e-3, balance: float = 0.01):
    """Next-token cross-entropy, plus the switch-transformer load-balancing term on the routers."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRouter

    routed = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: routed.append(out))
        for m in model.modules()
        if isinstance(m, Gemma4TextRouter)
    ]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=peak_lr, betas=(0.9, 0.95)
    )
    model.train()
    start, smooth = time.time(), None
    experts = TARGET_CONFIG["num_experts"]
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup=max(1, steps // 20))
        x = windows.batch(batch)
        routed.clear()
        logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        aux = 0.0
        for probs, _weights, index in routed:
            share = F.one_hot(index, experts).float().sum(1).mean(0) / index.shape[-1]
            aux = aux + experts * (share * probs.mean(0)).sum()
        total = loss + balance * aux / max(1, len(routed))
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        smooth = loss.item() if smooth is None else 0.98 * smooth + 0.02 * loss.item()
        if step % 25 == 0 or step == steps - 1:
            rate = (step + 1) * batch * windows.length / (time.time() - start)
            log(f"target step {step + 1}/{steps}  loss {smooth:.3f}  {rate:.0f} tok/s")
    for hook in hooks:
        hook.remove()
    model.eval()
    return smooth


def save_target(model, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("lm_head.")
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_json(folder / "config.json", TARGET_CONFIG)
    write_json(folder / "generation_config.json", GENERATION_CONFIG)


def load_bf16_target(folder: Path):
    """The target as the engine will see it: the saved bf16 weights, computed in fp32."""
    from safetensors.torch import load_file

    model = build_target()
    state = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("lm_head.") for k in missing), (missing, unexpected)
    model.tie_weights()
    return model.eval()
