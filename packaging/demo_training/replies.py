"""Stage 4, the drafter's data: the frozen target's own greedy replies (what verification will accept)."""

from __future__ import annotations

import random
import time

import torch

from .recipe import BOS, EOS, TURN_END, log


@torch.inference_mode()
def greedy_replies(model, prompts: list[list[int]], new_tokens: int, batch: int) -> list[tuple[list[int], int]]:
    """(prompt + greedy reply, prompt length) for each prompt; the reply is cut after <turn|>/<eos>.

    Batched with left padding; each result is then checked by one teacher-forced pass without padding
    and cut at the first token that is not the target's own argmax, so every kept token is exactly
    what greedy decoding of that prompt gives (what verification will accept)."""
    out = []
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    start = time.time()
    for b in range(0, len(order), batch):
        group = [prompts[i] for i in order[b:b + batch]]
        width = max(map(len, group))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        for row, prompt in zip(seq, group):
            reply = row[width:].tolist()
            for j, t in enumerate(reply):
                if t in (EOS, TURN_END):
                    reply = reply[:j + 1]
                    break
            out.append((prompt + reply, len(prompt)))
        log(f"replies {len(out)}/{len(prompts)}  {(time.time() - start):.0f} s")
    checked, kept = [], 0
    for b in range(0, len(out), batch):  # right-padded: padding after a sequence cannot change it
        group = out[b:b + batch]
        width = max(len(s) for s, _ in group)
        ids = torch.tensor([s + [0] * (width - len(s)) for s, _ in group])
        argmax = model(input_ids=ids).logits.argmax(-1)
        for row, (s, plen) in zip(argmax, group):
            good = plen
            while good < len(s) and int(row[good - 1]) == s[good]:
                good += 1
            kept += good - plen
            if good - plen >= 4:
                checked.append((s[:good], plen))
    total = sum(len(s) - p for s, p in out)
    log(f"replies checked: {kept}/{total} tokens are the target's greedy path; {len(checked)} sequences kept")
    return checked


def chat_prompt(request: str) -> str:
    return f"<bos><|turn>user\n{request.strip()}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def reply_prompts(tok, corpus: dict, plain: list[list[int]], count: int) -> list[list[int]]:
    """Prompts for the target's replies: 70 % chat requests (the held-out ones, then ones it was trained
    on), 30 % plain prefixes (a few lines of the standard library or of our docs)."""
    rng = random.Random(2)
    held = [r for r, _ in corpus["held_out"]][:count * 7 // 10]
    seen = [c[c.index("<|turn>user\n") + 13:c.index("<turn|>\n<|turn>model")] for c in corpus["chats"]]
    requests = held + rng.sample(seen, count * 7 // 10 - len(held))
    prompts = [tok.encode(chat_prompt(r), add_special_tokens=False).ids[-200:] for r in requests]
    while len(prompts) < count:
        doc = plain[rng.randrange(len(plain))]
        start = rng.randrange(max(1, len(doc) - 64))
        prompts.append([BOS] + doc[start:start + rng.randint(8, 48)])
    return prompts
