"""The inference engine (torch). Never imports Qt.

The Python API is `flashdesk.engine.Engine` (load a model, then `generate` a request as a stream of
events), with its request, events and controls:

    from flashdesk.engine import Engine, FinishEvent, GenerationRequest, SpecControl
    from flashdesk.engine.decode.chat_format import build_prompt_ids, messages_from

    engine = Engine.load("cyankiwi/gemma-4-26B-A4B-it-AWQ-4bit", draft_dir="z-lab/gemma-4-26B-A4B-it-DFlash")
    ids = build_prompt_ids(engine.tokenizer, messages_from("Why is the sky blue?"), enable_thinking=False)
    for event in engine.generate(GenerationRequest(ids, 256), SpecControl(True)):
        if isinstance(event, FinishEvent):
            print(event.text)

They are imported on first use, so that `import flashdesk.engine.errors` (or the CLI's `--help`)
does not load torch.
"""

from __future__ import annotations

import importlib

_API = {
    "Engine": "flashdesk.engine.decode.generation",
    "GenerationRequest": "flashdesk.engine.decode.generation",
    "StepEvent": "flashdesk.engine.decode.generation",
    "FinishEvent": "flashdesk.engine.decode.generation",
    "SamplingParams": "flashdesk.engine.decode.sampling",
    "SpecControl": "flashdesk.engine.decode.speculative",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'flashdesk.engine' has no attribute {name!r}")
