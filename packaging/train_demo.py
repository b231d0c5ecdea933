"""Train FlashDesk's demo pair: a tiny Gemma 4 target and a DFlash drafter for it, on the CPU.

What it trains on (all of it may ship with the app):
- FlashDesk's own documentation: README.md and any Markdown under docs/ (Apache-2.0, as the project)
  as committed at DOCS_REVISION (so that edits to them do not change the weights), plus Markdown
  folders given with --docs;
- the Python standard library's source of the interpreter running this script
  (`Path(os.__file__).parent`, without its test suites, codec tables and site-packages), which is
  PSF-licensed (Python Software Foundation License Version 2).
From the same files it also builds chat-formatted examples in the Gemma 4 chat format, so the demo
answers a chat: "Write a Python function to <a docstring's summary>" -> the function's source in a
code block, "What does <module> do?" -> the docstring, "Explain <heading>." -> that section of our docs.

What it does, in order (about 50 minutes with one thread on a 2-core CPU busy with other work):
1. a byte-fallback BPE tokenizer of VOCAB tokens trained on the corpus (`tokenizers`), with every
   Gemma 4 special token at its Gemma 4 id ("\\n" at 107 too) and the Gemma 4 chat template, loaded by
   transformers' GemmaTokenizer exactly like the real one;
2. the target: transformers' `Gemma4ForCausalLM` (the independent reference the engine is tested
   against) in the 26B-A4B's architecture at toy size: sliding and full attention layers with their
   different head dims, k_eq_v, proportional partial RoPE, a dense MLP beside a mixture of 8 experts
   (top 2), final softcap; trained as a language model on the corpus and the chat examples;
3. the drafter: z-lab's `DFlashDraftModel` (the `dflash` package) trained with the DFlash recipe
   against the frozen target: the target first writes greedy replies to chat requests (held-out ones
   first) and to plain prefixes of the corpus (z-lab trains on target-generated text: what the
   target itself writes is what verification accepts);
   then blocks of BLOCK tokens [anchor, mask x 15] at random anchors in those replies predict the
   target's next 15 tokens from the target's hidden states after TAP_LAYERS of the positions before the
   anchor, many blocks per sequence in one pass (each block sees only its own context), with the
   target's embedding (times sqrt(hidden), as the engine does for Gemma) and its tied head, and the
   loss of block position k weighted by exp(-(k-1)/7).

What it writes (bf16 weights, about 6 MB in all), under --out (default assets/demo_model/):
    target/   config.json, generation_config.json, model.safetensors (Gemma4ForCausalLM names),
              tokenizer.json, tokenizer_config.json, chat_template.jinja
    drafter/  config.json (z-lab's layout), model.safetensors (fc, hidden_norm, layers.N.*, norm)
    training.json  what went in (corpus files, sizes, sha256) and how long each stage took
    PYTHON-LICENSE.txt  the interpreter's LICENSE.txt (the PSF License asks for it with derivatives)
A NOTICE.md already in --out (provenance and licence, written by hand) is kept.

Deterministic: fixed seeds, sorted files, a fixed tokenizer alphabet, a fixed thread count; the same
DOCS_REVISION, Python (whose standard library is the corpus), torch and --threads give the same
weights, byte for byte.

    .venv/bin/python packaging/train_demo.py                  # the shipped pair, into assets/demo_model/
    .venv/bin/python packaging/train_demo.py --quick --out /tmp/demo   # a two-minute smoke run
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(os.__file__).parent
# Our docs as committed here (README.md, docs/); `--docs-revision worktree` reads the files as they are
DOCS_REVISION = "5a0d5002352b22be81377db7fefaf4982828c2d1"

# A BPE of its own rather than the 512-token test tokenizer (the old random demo's): that one is nearly
# one character a token (1.2-1.3 on our docs and the standard library), this one 2.7-3.6, so in the
# same training time the model reads three times the text and keeps three times as much in view.
VOCAB = 4096
SPECIAL_TOKENS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 46: "<|tool>", 47: "<tool|>",
                  48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>",
                  52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>", 105: "<|turn>",
                  106: "<turn|>"}
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

# Gemma 4's chat format (MODEL-SPEC.md), shared with the tiny test tokenizer and the demo pair
CHAT_TEMPLATE = (ROOT / "assets" / "gemma4_chat_template.jinja").read_text(encoding="utf-8")

VERBS = set("""return get set create make compute convert check add remove delete read write parse find build load
save format print run call open close update initialize generate encode decode split join copy move sort count
test validate register send receive start stop wait reset clear apply append insert extend replace strip escape
quote unquote normalize resolve search match compile execute fetch emit raise yield handle process construct
determine calculate compare show display draw render list iterate collect merge filter map wrap unwrap
translate tokenize decorate install import export""".split())
HELD_OUT = 1600  # requests kept out of the target's training: the drafter's data are its replies to them
SYSTEM_PROMPTS = ("You are a helpful assistant.", "Be brief.", "You are terse.", "Answer concisely.",
                  "You are a Python expert.")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- 1. the corpus ---------------------------------------------------------------------------------------

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "__pycache__", "lib2to3"}


def stdlib_files() -> list[Path]:
    files = []
    for path in sorted(STDLIB.rglob("*.py")):
        rel = path.relative_to(STDLIB)
        if set(rel.parts[:-1]) & SKIP_DIRS or rel.name.startswith("test_") or path.stat().st_size > 800_000:
            continue
        files.append(path)
    return files


def doc_texts(revision: str, extra: list[Path]) -> list[tuple[str, str]]:
    """(name, text) of our Markdown: README.md and docs/**.md as committed at `revision` (read with
    `git show`, so edits in the working tree do not change the weights), or as they are now with
    revision "worktree"; then the Markdown under each --docs folder."""
    if revision == "worktree":
        found = [(str(f.relative_to(ROOT)), read(f)) for f in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
                 if f.is_file()]
    else:
        def git(*args: str) -> str:
            try:
                return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                                      text=True, encoding="utf-8").stdout
            except (OSError, subprocess.CalledProcessError) as exc:
                raise SystemExit(f"train_demo: cannot read our docs at git revision {revision} ({exc}); "
                                 "give --docs-revision worktree to use the files as they are") from None

        names = [n for n in git("ls-tree", "-r", "--name-only", revision, "--", "README.md", "docs").splitlines()
                 if n.endswith(".md")]
        found = [(n, clean(git("show", f"{revision}:{n}"))) for n in sorted(names)]
    for folder in extra:
        found += [(str(f), read(f)) for f in sorted(Path(folder).rglob("*.md"))]
    return found


def clean(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\t", "    ")


def read(path: Path) -> str:
    return clean(path.read_text(encoding="utf-8", errors="replace"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(STDLIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def first_sentence(doc: str) -> str:
    line = doc.strip().split("\n\n")[0].replace("\n", " ")
    line = re.sub(r"\s+", " ", line).strip()
    match = re.match(r"(.+?[.!?])(\s|$)", line)
    return (match.group(1) if match else line).strip()


def _request_for(name: str, signature: str, summary: str, pick: int, kind: str) -> str:
    lowered = summary[0].lower() + summary[1:] if summary[:2] != summary[:2].upper() else summary
    bare = lowered.rstrip(".")
    imperative = bare.split(" ")[0] in VERBS
    if kind == "class":
        options = [f"Write a Python class {name}: {summary}", f"Implement a class {name} in Python. {summary}",
                   f"Show me a Python class that works like this: {summary}"]
    elif imperative:
        options = [f"Write a Python function to {bare}.", f"Write a Python function {name}{signature} to {bare}.",
                   f"Implement {name}{signature} in Python: {summary}", f"How do I {bare} in Python?"]
    else:
        options = [f"Write a Python function {name}{signature}. {summary}",
                   f"Implement {name} in Python. {summary}", f"Write a Python function: {summary}"]
    return options[pick % len(options)]


def _reply_with_code(name: str, code: str, pick: int) -> str:
    intros = ["", f"Here is `{name}`:\n\n", "Here is one way to write it:\n\n", f"Sure. `{name}` in Python:\n\n"]
    return f"{intros[pick % len(intros)]}```python\n{code}\n```"


def stdlib_examples(path: Path, text: str) -> list[tuple[str, str]]:
    """(request, reply) pairs from one module: functions and small classes with docstrings, and docstrings."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.split("\n")
    mod = module_name(path)
    pairs = []
    doc = ast.get_docstring(tree)
    if doc and len(doc) > 80:
        answer = textwrap.dedent(doc).strip()[:1200]
        pairs.append((f"What does the Python module {mod} do?" if len(pairs) % 2 == 0 else
                      f"Describe the {mod} module.", answer))
    nodes = [(n, None) for n in tree.body]
    nodes += [(m, n.name) for n in tree.body if isinstance(n, ast.ClassDef) for m in n.body]
    for node, owner in nodes:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or node.name.startswith("__") or node.end_lineno - node.lineno > 60:
            continue
        code = "\n".join(lines[node.lineno - 1:node.end_lineno])
        summary = first_sentence(doc)
        if len(summary) < 12 or len(summary) > 200:
            continue
        code = textwrap.dedent(code)
        pick = int(hashlib.sha256(f"{mod}.{node.name}".encode()).hexdigest(), 16)
        qualified = f"{mod}.{owner + '.' if owner else ''}{node.name}"
        if 60 <= len(code) <= 1600:
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            args = "" if kind == "class" else f"({ast.unparse(node.args)})"
            pairs.append((_request_for(node.name, args, summary, pick, kind), _reply_with_code(node.name, code, pick)))
        if len(doc) > 60 and pick % 3 == 0:
            pairs.append((f"What does {qualified} do?", textwrap.dedent(doc).strip()[:800]))
    return pairs


def doc_examples(text: str) -> list[tuple[str, str]]:
    """(request, reply) pairs from a Markdown file: each section under its heading."""
    pairs = []
    for section in re.split(r"\n(?=#{1,4} )", "\n" + text):
        section = section.strip()
        if not section.startswith("#"):
            continue
        heading, _, body = section.partition("\n")
        heading = heading.lstrip("#").strip().strip("`")
        body = body.strip()
        if len(body) < 80 or not heading:
            continue
        pick = int(hashlib.sha256(heading.encode()).hexdigest(), 16)
        request = [f"Explain {heading}.", f"Tell me about {heading}.", f"What is {heading}?",
                   f"Summarize the section \"{heading}\"."][pick % 4]
        pairs.append((request, body[:1500]))
    return pairs


def chat_text(pairs: list[tuple[str, str]], system: str | None) -> str:
    """One conversation in the Gemma 4 format, as the chat template renders it, the last reply after
    the empty thought channel of a generation prompt and ending in <turn|>."""
    out = "<bos>"
    if system:
        out += f"<|turn>system\n{system}<turn|>\n"
    for i, (request, reply) in enumerate(pairs):
        out += f"<|turn>user\n{request.strip()}<turn|>\n<|turn>model\n"
        if i == len(pairs) - 1:
            out += "<|channel>thought\n<channel|>"
        out += f"{reply.strip()}<turn|>\n"
    return out


def build_corpus(docs_revision: str, extra_docs: list[Path]) -> dict:
    """Plain documents, chat conversations, and held-out requests for the drafter's data."""
    rng = random.Random(1)
    plain, pairs, manifest = [], [], []
    docs = [("docs", name, text, None) for name, text in doc_texts(docs_revision, extra_docs)]
    stdlib = [("stdlib", str(path.relative_to(STDLIB)), read(path), path) for path in stdlib_files()]
    for kind, name, text, path in docs + stdlib:
        manifest.append((kind, name, hashlib.sha256(text.encode()).hexdigest()[:16], len(text)))
        plain.append(text)
        found = doc_examples(text) if kind == "docs" else stdlib_examples(path, text)
        # our own docs are few: they count three times, as plain text and as conversations
        pairs += found * (3 if kind == "docs" else 1)
        if kind == "docs":
            plain += [text, text]
    rng.shuffle(pairs)
    held_out, pairs = pairs[:HELD_OUT], pairs[HELD_OUT:]
    chats, i = [], 0
    while i < len(pairs):
        turns = 2 if rng.random() < 0.1 else 1
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.2 else None
        chats.append(chat_text(pairs[i:i + turns], system))
        i += turns
    return {"plain": plain, "chats": chats, "held_out": held_out, "manifest": manifest}


# -- 2. the tokenizer ------------------------------------------------------------------------------------

def train_tokenizer(texts: list[str], folder: Path, vocab_size: int = VOCAB):
    """A SentencePiece-style BPE with byte fallback, "▁" for spaces and Gemma 4's special ids.

    The merges are learnt over pieces (a newline; a run of spaces with the word after it) so that
    indentation and words become tokens; the tokenizer itself has no pre-tokenizer, as Gemma's."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.normalizer = normalizers.Replace(" ", "▁")
    learner.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n|▁*[^▁\n]+|▁+"), behavior="isolated")
    specials = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS.values()))
    texts = [specials.sub("\n", t) for t in texts]
    # the 160 most frequent characters, ties by code point (the trainer's own cut breaks ties at random)
    counts = Counter()
    for t in texts:
        counts.update(t.replace(" ", "▁"))
    alphabet = sorted(counts, key=lambda c: (-counts[c], ord(c)))[:160]
    reserved = len(SPECIAL_TOKENS) + 1 + 256  # specials, "\n", byte fallback
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - reserved + 200, min_frequency=2, show_progress=False,
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet), special_tokens=[])
    learner.train_from_iterator(texts, trainer=trainer)
    learnt = learner.get_vocab()
    merges = json.loads(learner.to_str())["model"]["merges"]
    ordered = sorted(learnt, key=learnt.get)  # the alphabet, then merges in the order they were learnt
    ordinary = [f"<0x{b:02X}>" for b in range(256)] + [t for t in ordered if t != "\n"]
    free = [i for i in range(vocab_size) if i not in SPECIAL_TOKENS and i != NEWLINE_ID]
    ordinary = ordinary[:len(free)]
    vocab = {tok: i for i, tok in SPECIAL_TOKENS.items()}
    vocab["\n"] = NEWLINE_ID
    vocab.update({tok: i for i, tok in zip(free, ordinary)})
    kept = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    assert len(vocab) == vocab_size, len(vocab)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in kept], unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    # the pipeline transformers' GemmaTokenizer builds, so both ways of loading it agree
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", BOS)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(SPECIAL_TOKENS.items())])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in sorted(SPECIAL_TOKENS.items())}
    config = {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
              "unk_token": "<unk>", "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "padding_side": "left", "model_max_length": 1_000_000,
              "added_tokens_decoder": added}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return tok


def encode(tok, texts: list[str], bos: bool) -> list[list[int]]:
    return [([BOS] if bos else []) + e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


# -- 3. the target ---------------------------------------------------------------------------------------

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
            rows.append(stream[start:start + self.length + 1])
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
    hooks = [m.register_forward_hook(lambda _m, _i, out: routed.append(out)) for m in model.modules()
             if isinstance(m, Gemma4TextRouter)]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=peak_lr, betas=(0.9, 0.95))
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
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
               if not k.startswith("lm_head.")}
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


# -- 4. the target's own replies: the drafter's data ----------------------------------------------------

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


# -- 5. the drafter --------------------------------------------------------------------------------------

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
        h = layer(hidden_states=h, target_hidden=context, attention_mask=mask, position_ids=positions,
                  position_embeddings=rope)
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
        group = seqs[b:b + batch]
        width = max(map(len, group))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in group])
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states
        tapped = extract_context_feature(hidden, TAP_LAYERS)
        feats += [tapped[i, :len(s)].to(torch.bfloat16) for i, s in enumerate(group)]
    return feats


def train_drafter(drafter, target, data: list[tuple[list[int], int]], steps: int, batch: int, blocks: int,
                  seed: int, peak_lr: float = 3e-3, gamma: float = 7.0) -> float:
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
            features[row, :len(seq)] = feats[i].float()
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
            log(f"drafter step {step + 1}/{steps}  loss {smooth:.3f}  accepted per block {acc:.2f}  "
                f"{(step + 1) / (time.time() - start):.2f} steps/s")
    drafter.eval()
    return acc


def save_drafter(drafter, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items()
               if "rotary_emb" not in k}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_json(folder / "config.json", DRAFT_CONFIG)


# -- the whole run ---------------------------------------------------------------------------------------

def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "demo_model")
    parser.add_argument("--docs-revision", default=DOCS_REVISION,
                        help="git revision to read README.md and docs/ from, or 'worktree' (default: %(default)s)")
    parser.add_argument("--docs", type=Path, action="append", default=[], help="more Markdown folders for the corpus")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the weights depend on it)")
    parser.add_argument("--target-steps", type=int, default=900)
    parser.add_argument("--draft-steps", type=int, default=2400)
    parser.add_argument("--replies", type=int, default=5000, help="target replies generated for the drafter")
    parser.add_argument("--save-replies", type=Path, help="also keep the drafter's data (token ids) in this file")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few steps of everything")
    args = parser.parse_args(argv)
    if args.quick:
        args.target_steps, args.draft_steps, args.replies = 30, 30, 48
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    random.seed(0)
    times, t0 = {}, time.time()
    log(f"Python {sys.version.split()[0]} standard library at {STDLIB}; torch {torch.__version__}, "
        f"{args.threads} thread(s)")

    work = args.out.with_name(args.out.name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    target_dir, drafter_dir = work / "target", work / "drafter"

    corpus = build_corpus(args.docs_revision, args.docs)
    chars = sum(map(len, corpus["plain"]))
    log(f"corpus: {len(corpus['manifest'])} files, {chars / 1e6:.1f} M characters of plain text, "
        f"{len(corpus['chats'])} conversations, {len(corpus['held_out'])} held-out requests")
    tok = train_tokenizer(corpus["plain"] + corpus["chats"], target_dir)
    plain = encode(tok, corpus["plain"], bos=True)
    chats = encode(tok, corpus["chats"], bos=False)  # they begin with their own <bos>
    n_plain, n_chat = sum(map(len, plain)), sum(map(len, chats))
    log(f"tokenizer: {VOCAB} tokens; {n_plain / 1e6:.2f} M plain tokens ({chars / n_plain:.2f} characters a token), "
        f"{n_chat / 1e6:.2f} M chat tokens")
    times["corpus_and_tokenizer_s"] = time.time() - t0

    t = time.time()
    target = build_target()
    log(f"target: {sum(p.numel() for p in target.parameters()) / 1e6:.2f} M parameters")
    windows = Windows(plain, chats, chat_share=0.4, length=512, seed=1)
    target_loss = train_target(target, windows, args.target_steps, batch=8)
    save_target(target, target_dir)
    times["target_s"] = time.time() - t

    t = time.time()
    target = load_bf16_target(target_dir)  # the drafter learns the target as it ships
    prompts = reply_prompts(tok, corpus, plain, args.replies)
    data = greedy_replies(target, prompts, new_tokens=160, batch=32)
    times["replies_s"] = time.time() - t

    t = time.time()
    drafter = build_drafter(seed=3)
    log(f"drafter: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f} M parameters")
    if args.save_replies:
        torch.save(data, args.save_replies)
    accepted = train_drafter(drafter, target, data, args.draft_steps, batch=8, blocks=16, seed=4)
    save_drafter(drafter, drafter_dir)
    times["drafter_s"] = time.time() - t
    times["total_s"] = time.time() - t0

    write_json(work / "training.json", {
        "python": sys.version.split()[0], "torch": torch.__version__, "threads": args.threads,
        "docs_revision": args.docs_revision,
        "quick": args.quick, "target_steps": args.target_steps, "draft_steps": args.draft_steps,
        "plain_tokens": n_plain, "chat_tokens": n_chat, "conversations": len(corpus["chats"]),
        "drafter_sequences": len(data), "final_target_loss": round(target_loss, 4),
        "final_drafter_accepted_per_block": round(accepted, 3),
        "seconds": {k: round(v, 1) for k, v in times.items()},
        "corpus": [{"kind": k, "file": f, "sha256_16": h, "chars": n} for k, f, h, n in corpus["manifest"]],
    })
    if (STDLIB / "LICENSE.txt").is_file():  # the PSF License asks that its text and notice go with derivatives
        shutil.copyfile(STDLIB / "LICENSE.txt", work / "PYTHON-LICENSE.txt")
    notice = args.out / "NOTICE.md"  # written by hand: kept
    if notice.is_file():
        shutil.copyfile(notice, work / "NOTICE.md")
    if args.out.exists():
        shutil.rmtree(args.out)
    work.rename(args.out)
    log(f"wrote {args.out} in {times['total_s'] / 60:.1f} min "
        f"({', '.join(f'{k} {v / 60:.1f} min' for k, v in times.items() if k != 'total_s')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
