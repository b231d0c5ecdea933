"""What the setup page offers: the recommended pair for an NVIDIA GPU, whether it fits this card
(from the memory plan of the real model's shapes, before a byte is downloaded), the same for the
pair with Gemma 4's MTP assistant beside it (to compare the two drafters), and the models already
on disk (the same as `flashdesk models list`, and the demo pair when it was made).

Testing aid: FLASHDESK_FAKE_GPU="NAME,FREE_GIB,TOTAL_GIB" stands for torch's view of GPU 0, so the
fit can be checked on a machine without one.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flashdesk.engine.hub.models import ASSISTANT_BYTES, ASSISTANT_REPO, DEFAULT_REPOS
from flashdesk.engine.loading.memory_plan import MIN_USEFUL_CONTEXT as MIN_CONTEXT  # below it: not worth loading

RECOMMENDED = DEFAULT_REPOS  # the 4-bit (AWQ) Gemma 4 26B-A4B and z-lab's DFlash drafter for it
DOWNLOAD_BYTES = 18 * 10**9  # about: the AWQ checkpoint (its vision tower included) and the bf16 drafter
RECOMMENDED_ASSISTANT = ASSISTANT_REPO  # and, to compare, Gemma 4's MTP assistant beside the drafter
ASSISTANT_DOWNLOAD_BYTES = ASSISTANT_BYTES
DEFAULT_CONTEXT = 32768  # what one click loads when the card has room for more
FAKE_GPU_ENV = "FLASHDESK_FAKE_GPU"
GIB = 1024**3


@dataclass
class Survey:
    recommended: list[str]
    download_bytes: int
    device_name: str | None  # None: no CUDA device
    free_bytes: int
    total_bytes: int
    fits: bool
    context: int  # the context one click would load (0 when it does not fit)
    longest_context: int
    needed_bytes: int  # device memory of the pair at MIN_CONTEXT tokens
    text: str  # the verdict in one sentence
    models: list[dict] = field(default_factory=list)  # on disk: name, target, draft, kind, size, complete
    # the pair with the MTP assistant beside the drafter: {"repo", "download_bytes"} and the same
    # fit fields as above (fits, context, longest_context, needed_bytes, text) for the three
    assistant: dict | None = None

    def as_dict(self) -> dict:
        """The fields of protocol.Surveyed (the worker sends `Surveyed(**as_dict())`)."""
        return asdict(self)


def gpu_memory() -> tuple[str, int, int] | None:
    """(name, free bytes, total bytes) of GPU 0, or None without one."""
    fake = os.environ.get(FAKE_GPU_ENV)
    if fake:
        name, free_gib, total_gib = fake.rsplit(",", 2)
        return name.strip(), int(float(free_gib) * GIB), int(float(total_gib) * GIB)
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return torch.cuda.get_device_name(0), int(free), int(total)


def real_pair():
    """(config, int4 weight bytes, drafter config) of the pair FlashDesk is for, as it runs on a GPU:
    the 4-bit target and the bf16 drafter with the exact shapes `bench --synthetic` builds
    (docs/model.md), so its memory plan needs no download."""
    from flashdesk.engine.loading.memory_plan import int4_weight_bytes
    from flashdesk.engine.model.config import parse_config, parse_draft_config
    from flashdesk.engine.model.known_models import draft_raw, target_raw

    cfg = parse_config(target_raw())
    return cfg, int4_weight_bytes(cfg), parse_draft_config(draft_raw())


def real_assistant():
    """The MTP assistant's config (engine/model/known_models.py), checked against the real target."""
    from flashdesk.engine.model.assistant import check_assistant_pair, parse_assistant_config
    from flashdesk.engine.model.config import parse_config
    from flashdesk.engine.model.known_models import assistant_raw, target_raw

    cfg = parse_assistant_config(assistant_raw(), "the MTP assistant's config")
    check_assistant_pair(parse_config(target_raw()), cfg, "the MTP assistant")
    return cfg


def recommended_fit(gpu: tuple[str, int, int] | None, with_assistant: bool = False) -> dict:
    """Whether the recommended pair (`with_assistant`: and the MTP assistant beside its drafter)
    fits `gpu` with fp8 KV, with how much context, and a sentence."""
    from flashdesk.engine.loading.memory_plan import longest_context, plan_memory

    cfg, weights, draft = real_pair()
    what = "this pair"
    if with_assistant:
        draft, what = (draft, real_assistant()), "the pair with the MTP assistant"
    needed = plan_memory(cfg, weights, MIN_CONTEXT, "fp8", draft).total
    if gpu is None:
        return {
            "device_name": None,
            "free_bytes": 0,
            "total_bytes": 0,
            "fits": False,
            "context": 0,
            "longest_context": 0,
            "needed_bytes": needed,
            "text": f"No NVIDIA GPU here: {what} needs one with about {needed / GIB:.0f} GiB free "
            "(a 24 GB card). The demo below runs on the CPU.",
        }
    name, free, total = gpu
    longest = min(longest_context(cfg, weights, "fp8", free, draft), cfg.max_position_embeddings)
    fits = longest >= MIN_CONTEXT
    where = f"{name} ({free / GIB:.1f} GiB free of {total / GIB:.1f})"
    also = " with the MTP assistant" if with_assistant else ""
    if fits:
        text = f"Fits {where}{also}: context up to {longest:,} tokens with the fp8 KV cache."
    else:
        advice = (
            "close what else uses the GPU and check again" if total >= needed * 1.05 else "it needs a card with 24 GB"
        )
        needs = "the pair with the MTP assistant needs" if with_assistant else "the pair needs"
        text = f"Does not fit {where}: {needs} {needed / GIB:.1f} GiB at {MIN_CONTEXT:,} tokens; {advice}."
    return {
        "device_name": name,
        "free_bytes": free,
        "total_bytes": total,
        "fits": fits,
        "context": min(longest, DEFAULT_CONTEXT) if fits else 0,
        "longest_context": longest,
        "needed_bytes": needed,
        "text": text,
    }


def models_on_disk(demo_folder: Path | None = None) -> list[dict]:
    """Targets and drafters in the Hugging Face cache and the added folders, and the demo pair."""
    from flashdesk.engine.hub.demo import demo_paths, is_complete
    from flashdesk.engine.hub.models import list_models

    found = []
    if demo_folder is not None and is_complete(demo_folder):
        target, draft = demo_paths(demo_folder)
        found.append(
            {
                "name": "Demo model (CPU)",
                "kind": "demo",
                "target": str(target),
                "draft": str(draft),
                "size": 0,
                "complete": True,
            }
        )
    try:
        entries = list_models()
    except Exception:  # noqa: BLE001 - an unreadable cache: nothing listed, the rest still works
        entries = []
    for e in entries:
        found.append(
            {
                "name": e.name,
                "kind": e.kind,
                "target": str(e.path) if e.kind not in ("drafter", "assistant") else None,
                "draft": str(e.path) if e.kind in ("drafter", "assistant") else None,
                "size": e.size,
                "complete": e.complete,
            }
        )
    return found


def assistant_fit(gpu: tuple[str, int, int] | None) -> dict:
    """What the setup page offers beside the pair: the MTP assistant's Hub id, its download size,
    and the fit of the pair with it on `gpu` (the fields of recommended_fit but the device's)."""
    fit = recommended_fit(gpu, with_assistant=True)
    keep = ("fits", "context", "longest_context", "needed_bytes", "text")
    return {"repo": RECOMMENDED_ASSISTANT, "download_bytes": ASSISTANT_DOWNLOAD_BYTES, **{k: fit[k] for k in keep}}


def survey(demo_folder: Path | None = None) -> Survey:
    gpu = gpu_memory()
    return Survey(
        recommended=list(RECOMMENDED),
        download_bytes=DOWNLOAD_BYTES,
        models=models_on_disk(demo_folder),
        assistant=assistant_fit(gpu),
        **recommended_fit(gpu),
    )
