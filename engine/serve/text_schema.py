"""The request body of POST /v1/completions (OpenAI's legacy text completions), with the engine's bounds.

One prompt per request: a string, or a list of token ids (lm-eval sends its tokens), also as a list
holding one of those; a list of several prompts is refused by name. The legacy `logprobs` is a
number (the alternatives per token, up to 20, as vLLM allows), and `echo` puts the prompt, and with
`logprobs` its tokens' log probabilities, before the reply: what lm-eval's loglikelihood tasks ask
for. `max_tokens` defaults to 16, as OpenAI's; 0 asks for the prompt alone (with `echo`).

As in chat (schema.py), a field that would change the reply and that this engine cannot honour gets
a 400 naming it: `suffix` (fill-in-the-middle), several choices, `logit_bias`, and the
chat fields that mean nothing for a raw prompt (`messages`, tools, response formats, thinking).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flashdesk.engine.decode.logprobs import MAX_TOP
from flashdesk.engine.serve.schema import INT64, UNSUPPORTED, StreamOptions, refuse, stop_strings

DEFAULT_MAX_TOKENS = 16  # OpenAI's for text completions


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


# chat's fields that change a chat reply and have no meaning for a raw prompt: the values that ask
# for nothing, and why any other is refused
CHAT_ONLY = {
    "messages": (_empty, "/v1/completions takes a prompt; send messages to /v1/chat/completions"),
    "tools": (_empty, "tools belong to /v1/chat/completions"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), "tool_choice belongs to /v1/chat/completions"),
    "response_format": (
        lambda v: v is None or v == {"type": "text"},
        "response_format is not supported by /v1/completions (only chat completions take it)",
    ),
    "reasoning_effort": (lambda v: v in (None, "none"), "a raw prompt sets thinking itself (Gemma 4's chat format)"),
    "chat_template_kwargs": (_empty, "a raw prompt has no chat template"),
    "max_completion_tokens": (lambda v: v is None, "in /v1/completions the reply's length is max_tokens"),
    "functions": (_empty, "functions belong to /v1/chat/completions"),
    "function_call": (lambda v: v in (None, "none"), "function_call belongs to /v1/chat/completions"),
    **{
        name: (_empty, f"{name} is not supported by /v1/completions")
        for name in ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
    },
    "top_logprobs": (
        lambda v: v is None,
        "in /v1/completions, logprobs is the number of alternatives per token (0 to 20); top_logprobs is chat's",
    ),
}
ALLOWED_HERE = ("echo",)  # refused in chat (UNSUPPORTED), what this endpoint does


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _nothing_ignored(cls, data: Any) -> Any:
        """A 400 naming the first field that asks for what this endpoint cannot do."""
        if isinstance(data, dict):
            for table in (UNSUPPORTED, CHAT_ONLY):
                for name, (harmless, why) in table.items():
                    if name in data and name not in ALLOWED_HERE and not harmless(data[name]):
                        raise refuse(name, why)
        return data

    model: str | None = None  # None: the model this server serves
    prompt: str | list[int]
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)  # None: the model's generation_config
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)  # -1 and 0: off
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0)  # None: what the context leaves
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    echo: bool = False
    suffix: str | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)  # OpenAI's, on the reply's tokens
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)  # vLLM's; 1: off
    logit_bias: dict | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        """A prompt, or a list of exactly one (a string or a list of ids)."""
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            if len(prompt) > 1:
                raise refuse(
                    "prompt",
                    f"one prompt per request: this is a list of {len(prompt)} prompts (send them one at a time)",
                )
            prompt = prompt[0]
        if isinstance(prompt, list) and not prompt:
            raise refuse("prompt", "the prompt is an empty list of token ids: give at least one")
        return prompt

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, stop: Any) -> Any:
        return stop_strings(stop)

    @model_validator(mode="after")
    def _supported(self) -> "CompletionRequest":
        refusals = [
            (self.n != 1, "n", f"only n=1 is supported (one choice per request), got {self.n}"),
            (bool(self.suffix), "suffix", "suffix (text after the insertion, fill-in-the-middle) is not supported"),
            (bool(self.logit_bias), "logit_bias", "logit_bias is not supported"),
            (
                self.stream_options is not None and not self.stream,
                "stream_options",
                "stream_options is only allowed with stream: true",
            ),
        ]
        for refused, param, text in refusals:
            if refused:
                raise refuse(param, text)
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
