"""A /v1/completions request as a Job for the runner, with the objects that answer it.

Why apart from chat's: the prompt is raw (text tokenized as written, or token ids checked against
the vocabulary) and made on the prompt threads (prompt.py), there are no messages or thinking, and
`echo` with `logprobs` asks the engine for the prompt's own log probabilities, which runs the whole
prompt (nothing is reused from the prefix cache for it). `max_tokens: 0` runs one token that the
answer leaves out (text_completion.py): the engine's prefill is the one pass that gives them.
"""

from __future__ import annotations

import time

from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.serve.errors import ApiError
from flashdesk.engine.serve.prompt import PromptMaker, fitted_text
from flashdesk.engine.serve.runner import Job, Runner
from flashdesk.engine.serve.text_completion import TextCompletion
from flashdesk.engine.serve.text_schema import CompletionRequest


def sampling_for(body, defaults: dict, suppress: tuple[int, ...] = ()) -> SamplingParams:
    """A request's sampling (chat's or text's), the model's generation_config filling what it leaves out."""

    def value(given, name: str):
        return given if given is not None else defaults[name]

    return SamplingParams(
        value(body.temperature, "temperature"),
        value(body.top_p, "top_p"),
        max(0, value(body.top_k, "top_k")),
        body.seed,
        suppress=suppress,
        min_p=value(body.min_p, "min_p"),
        repetition_penalty=value(body.repetition_penalty, "repetition_penalty"),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
    )


def _check_ids(ids: list[int], vocab: int | None) -> None:
    if vocab is None:
        return
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise ApiError(400, f"prompt token id {bad} is outside this model's vocabulary (0..{vocab - 1})", "prompt")


async def text_job(
    body: CompletionRequest,
    runner: Runner,
    prompts: PromptMaker | None,
    defaults: dict,
    model: str,
    scope: str,
) -> tuple[Job, TextCompletion]:
    """The job for a completions request and the objects of its answer, or an ApiError."""
    if body.model is not None and body.model != model:
        raise ApiError(
            404, f"the model {body.model!r} does not exist: this server serves {model!r}", "model", "model_not_found"
        )
    started = time.monotonic()
    try:
        if isinstance(body.prompt, list):
            _check_ids(body.prompt, runner.vocab_size)
        if prompts is not None:
            fitted = await prompts.fit_text(body.prompt, body.max_tokens)
        elif isinstance(body.prompt, list):
            fitted = fitted_text(list(body.prompt), runner.context_limit, body.max_tokens)
        else:
            raise ApiError(400, "this server has no tokenizer: give the prompt as token ids", "prompt")
    except ApiError as exc:
        runner.refused(exc.message, body.stream, time.monotonic() - started)
        raise
    echo = None
    if body.echo:
        echo = body.prompt if isinstance(body.prompt, str) else await prompts.text_of(body.prompt) if prompts else ""
    job = Job(
        [],
        sampling_for(body, defaults),
        fitted.max_new_tokens,
        stop=body.stop_strings,
        ignore_eos=body.ignore_eos,
        stream=body.stream,
        fitted=fitted,
        scope=scope,
        logprobs=body.logprobs,
        prompt_logprobs=body.echo and body.logprobs is not None,
    )
    completion = TextCompletion(
        job.id, int(time.time()), model, echo=echo, logprobs=body.logprobs is not None, reply=body.max_tokens != 0
    )
    return job, completion
