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
        group = [prompts[i] for i in order[b : b + batch]]
        width = max(map(len, group))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        seq = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        for row, prompt in zip(seq, group):
            reply = row[width:].tolist()
            for j, t in enumerate(reply):
                if t in (EOS, TURN_END):
                    reply = reply[: j + 1]
                    break
            out.append((prompt + reply, len(prompt)))
        log(f"replies {len(out)}/{len(prompts)}  {(time.time() - start):.0f} s")
    checked, kept = [], 0
    for b in range(0, len(out), batch):  # right-padded: padding after a sequence cannot change it
        group = out[b : b + batch]
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


LANGUAGES = ("JavaScript", "TypeScript", "Rust", "Go", "C", "Java", "bash")

ASKS_ABOUT_CODE = (
    "Here is my Python code and it raises an exception on the last line. What is wrong?\n\n{code}",
    "Refactor this function to be more readable and add error handling:\n\n{code}",
    "Explain what this code does, step by step:\n\n{code}",
    "Write pytest tests for this function:\n\n{code}",
    "Add type hints and a docstring to this function:\n\n{code}",
    "Can this be made faster? Show the improved version.\n\n{code}",
)


def open_requests(held_out: list[tuple[str, str]], count: int, rng: random.Random) -> list[str]:
    """Requests in the ways people ask (another language, a bug to find, code to explain or test or
    refactor, extra conditions), made from the held-out pairs: the target never saw these forms, so
    its replies to them are what a drafter meets in use, not a recitation of its training text."""
    out = []
    for i in range(count):
        request, reply = held_out[i % len(held_out)]
        code = _short_code(reply[reply.index("```") :]) if "```" in reply else None
        style = rng.randrange(4)
        if style == 0 and code:
            out.append(rng.choice(ASKS_ABOUT_CODE).format(code=code))
        elif style == 1 and request.startswith("Write a Python "):
            out.append(f"In {rng.choice(LANGUAGES)}, write a {request[len('Write a Python ') :]}")
        elif style == 2:
            out.append(f"{request} Keep it short and include an example.")
        else:
            out.append(
                f"{request} Include type hints and a short docstring."
                if code
                else f"{request} Explain it simply, in a few sentences."
            )
    return out


def _short_code(block: str, limit: int = 500) -> str:
    """A code block cut to whole lines within `limit` characters (the prompt keeps its question)."""
    lines, size = [], 0
    for line in block.strip("`\n").split("\n")[1:]:
        size += len(line) + 1
        if size > limit and lines:
            break
        lines.append(line)
    return "```python\n" + "\n".join(lines) + "\n```"


def reply_prompts(tok, corpus: dict, plain: list[list[int]], count: int) -> list[list[int]]:
    """Prompts for the target's replies: 70 % chat requests (the held-out ones, as many again reworded by
    open_requests, then ones it was trained on), 30 % plain prefixes (a few lines of the standard library
    or of our docs)."""
    rng = random.Random(2)
    chat_count = count * 7 // 10
    held = [r for r, _ in corpus["held_out"]][:chat_count]
    reworded = open_requests(corpus["held_out"], min(len(held), chat_count - len(held)), rng)
    seen = [c[c.index("<|turn>user\n") + 13 : c.index("<turn|>\n<|turn>model")] for c in corpus["chats"]]
    requests = held + reworded + rng.sample(seen, chat_count - len(held) - len(reworded))
    prompts = [tok.encode(chat_prompt(r), add_special_tokens=False).ids[-200:] for r in requests]
    while len(prompts) < count:
        doc = plain[rng.randrange(len(plain))]
        start = rng.randrange(max(1, len(doc) - 64))
        prompts.append([BOS] + doc[start : start + rng.randint(8, 48)])
    return prompts
