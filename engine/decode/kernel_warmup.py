"""Compile the Triton kernels of a generation before the first prompt, in parallel.

On a fresh machine every kernel a generation launches compiles at its first launch, one after
another: the first reply would wait for some forty compiles, and a verify length seen for the
first time would stall again. `compile_generation_kernels` runs the passes a `Decoder` runs (a prefill chunk,
the drafter's context updates, decode, every verify block length, every draft length) once with
their launches compiling on all cores instead of running (kernels.compile_ahead), on the empty
cache and drafter context a generation will use, and leaves them empty again. No CUDA graph is
captured here: those capture on first use, once the kernels exist.
"""

from __future__ import annotations

import time

import torch

from flashdesk.engine.decode.speculative import PENDING_LIMIT, PREFILL_CHUNK
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.model.drafter import DraftContext, Drafter
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.model.kv_cache import KVCache
from flashdesk.kernels.backend import fallbacks, use_triton
from flashdesk.kernels.compile_ahead import compile_ahead


@torch.inference_mode()
def compile_generation_kernels(
    model: Gemma4,
    cache: KVCache,
    drafter: Drafter | None = None,
    ctx: DraftContext | None = None,
    workers: int | None = None,
    block_rows: int | None = None,
    mtp=None,
) -> float | None:
    """Seconds it took to compile every kernel a generation over `cache` (and `ctx`) launches, or
    None where nothing compiles ahead (the torch kernels, Triton's interpreter): they compile at
    first use. The cache and context must be empty and are left empty. `block_rows`: the longest
    verify block without a drafter (an MTP assistant's last token and drafts); `mtp`: an
    MtpDrafter, whose one draft step compiles every kernel of its rounds."""
    if cache.length or (ctx is not None and ctx.length):
        raise ValueError("kernels compile ahead on an empty cache and drafter context only")
    if not use_triton(model.device) or fallbacks():  # a torch kernel would run for real, on garbage
        return None
    began = time.perf_counter()
    taps = drafter.cfg.target_layer_ids if drafter is not None else ()
    rows = drafter.cfg.block_size if drafter is not None else block_rows or 1  # the anchor and the drafts
    chunk = min(PREFILL_CHUNK, cache.max_context, ctx.max_context if ctx is not None else PREFILL_CHUNK)
    ids = torch.zeros(chunk, dtype=torch.long, device=model.device)  # a token every vocabulary has
    try:
        with compile_ahead(workers) as ahead:
            if not ahead:
                return None
            out = model.forward(ids, cache, taps=taps, logits_rows="last")  # a prompt's chunk
            features = out.taps
            if mtp is not None:  # a round over the chunk's K/V: the assistant's kernels
                assert out.hidden is not None  # Gemma4.compute always returns the final norm's output
                mtp.after_prefill(out.hidden[-1:], chunk)
                mtp.draft(cache, ids[:1], 1, SamplingParams(), None)
                mtp.state = None
            cache.reset()
            for m in range(1, rows + 1):  # decode (m = 1, last row or all) and verify blocks
                for logits_rows in ("last", "all") if m == 1 else ("all",):
                    model.compute(ids[:m], cache, taps, logits_rows)
            if drafter is not None:
                assert ctx is not None and features is not None  # a drafter comes with its context; taps asked
                # the context a prompt's chunk, a step's accepted tokens or plain steps' features add
                for c in sorted({chunk, min(chunk, PENDING_LIMIT), *range(1, rows + 1)}):
                    drafter.add_context(ctx, features[:c])
                    ctx.reset()
                drafter.add_context(ctx, features[:1])
                for k in range(1, rows):
                    ctx.note_block(k + 1)
                    drafter.draft_logits(ctx, ids[:1], k)
    finally:
        cache.reset()
        if ctx is not None:
            ctx.reset()
    return time.perf_counter() - began
