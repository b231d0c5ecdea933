"""The request body of POST /v1/chat/completions, as OpenAI defines it, with the bounds this engine keeps.

Strict types (a number is not a string, a boolean is not 1, NaN is not a number), the OpenAI ranges
(temperature 0..2, top_p in (0, 1]), and a 400 naming the field for every field of OpenAI's and
vLLM's requests that would change the reply and that the engine cannot honour (several choices, the
legacy functions, vLLM's guided decoding fields, beam search...), instead of silently
ignoring it. `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` are read in tools.py.
What does not change the reply is taken and not used (`user`, `metadata`, `store`, `service_tier`,
...: METADATA). Fields neither API defines are ignored, as vLLM ignores
them, so clients that send vendor extras of their own still work.
Thinking: `reasoning_effort` other than "none", or vLLM's `chat_template_kwargs.enable_thinking`
(which wins when both are given). `top_k`, `min_p`, `repetition_penalty` and `ignore_eos` are vLLM's extensions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from flashdesk.engine.decode.logprobs import MAX_TOP

MAX_STOP_STRINGS = 16
INT64 = 2**63
# taken and not used: they describe the request, never the reply
METADATA = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key")


def _absent(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _one_of(*harmless: Any):
    return lambda value: value is None or value in harmless


# fields of OpenAI's and vLLM's requests that would change the reply: the values that ask for
# nothing, and why any other is refused (a 400 naming the field)
UNSUPPORTED = {
    "functions": (_absent, "functions is the older name of tools, which this server takes: send tools"),
    "function_call": (_one_of("none"), "function_call is the older name of tool_choice, which this server takes"),
    "audio": (_absent, "audio output is not supported: this server answers in text"),
    "modalities": (_one_of(["text"]), 'only the "text" modality is supported'),
    "prediction": (_absent, "predicted outputs are not supported"),
    "web_search_options": (_absent, "web search is not supported"),
    "verbosity": (_absent, "verbosity is not supported (leave it out)"),
    "min_tokens": (_one_of(0), "min_tokens is not supported (give 0 or leave it out)"),
    "best_of": (_one_of(1), "best_of is not supported (one sample per request)"),
    "use_beam_search": (_one_of(False), "beam search is not supported"),
    "length_penalty": (_one_of(1, 1.0), "length_penalty is not supported (it applies to beam search)"),
    "stop_token_ids": (_absent, "stop_token_ids is not supported (give stop strings in stop)"),
    "bad_words": (_absent, "bad_words is not supported"),
    "allowed_token_ids": (_absent, "allowed_token_ids is not supported"),
    "logits_processors": (_absent, "logits_processors is not supported"),
    "include_stop_str_in_output": (_one_of(False), "include_stop_str_in_output is not supported"),
    "skip_special_tokens": (_one_of(True), "skip_special_tokens: false is not supported"),
    "echo": (_one_of(False), "echo is not supported"),
    "chat_template": (_absent, "a chat template of the request's own is not supported"),
    "documents": (_absent, "documents are not supported"),
    "prompt_logprobs": (_absent, "prompt_logprobs is not supported"),
    "truncate_prompt_tokens": (_absent, "truncate_prompt_tokens is not supported"),
    "return_tokens_as_token_ids": (_one_of(False), "return_tokens_as_token_ids is not supported"),
    "guided_json": (_absent, "guided decoding is not supported"),
    "guided_regex": (_absent, "guided decoding is not supported"),
    "guided_choice": (_absent, "guided decoding is not supported"),
    "guided_grammar": (_absent, "guided decoding is not supported"),
    "structured_outputs": (_absent, "structured outputs are not supported"),
}


def refuse(param: str, text: str) -> PydanticCustomError:
    """A validation error that names its field (the request-level checks have no field location)."""
    return PydanticCustomError("refused", "{text}", {"text": text, "param": param})


def _text(content: Any) -> str:
    """Message content: a string, or a list of text parts (joined as the chat template joins them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(
                    f'part {i} is not a text part ({{"type": "text", "text": ...}}; got {kind!r}): '
                    "this server takes text only"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"content must be a string or a list of text parts, got {type(content).__name__}")


def stop_strings(stop):
    """`stop` as both APIs take it: a string, or a list of at most MAX_STOP_STRINGS strings."""
    if stop is None or isinstance(stop, str):
        return stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise refuse("stop", f"stop must be a string or a list of strings, got {stop!r}"[:200])
    if len(stop) > MAX_STOP_STRINGS:
        raise refuse("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    return stop


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str
    tool_calls: list | None = None  # an assistant's earlier calls (checked in tools.py)
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _content_as_text(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("tool_calls") and "content" not in data:
            data = {**data, "content": None}  # OpenAI's clients leave an assistant's empty content out
        if isinstance(data, dict) and "content" in data:
            content = data["content"]
            if content is None and data.get("role") == "assistant":  # an assistant turn with tool calls only
                content = ""
            data = {**data, "content": _text(content)}
        return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class TemplateOptions(BaseModel):
    """vLLM's `chat_template_kwargs`: only `enable_thinking` means something to Gemma 4's template here."""

    model_config = ConfigDict(extra="ignore", strict=True)

    enable_thinking: bool | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _nothing_ignored(cls, data: Any) -> Any:
        """A 400 naming the first field that asks for what this server cannot do."""
        if isinstance(data, dict):
            for name, (harmless, why) in UNSUPPORTED.items():
                if name in data and not harmless(data[name]):
                    raise refuse(name, why)
            if data.get("top_logprobs") is not None and not data.get("logprobs"):
                raise refuse("top_logprobs", "top_logprobs is only allowed with logprobs: true")
        return data

    model: str | None = None  # None: the model this server serves
    messages: list[Message]
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)  # None: the model's generation_config
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)  # -1 and 0: off (vLLM takes -1)
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)  # 0: off
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name; wins over max_tokens
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: TemplateOptions | None = None
    ignore_eos: bool = False
    n: int = 1
    logprobs: bool | None = None  # each reply token's log probability (engine/decode/logprobs.py)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP)  # and this many alternatives
    tools: list | None = None  # functions the model may call (tools.py checks them)
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None  # text, json_object or json_schema (tools.py)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)  # OpenAI's, on the reply's tokens
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)  # vLLM's; 1: off
    logit_bias: dict | None = None
    # vLLM's pair for going on with a reply the last assistant message holds (one a context cut off)
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    @field_validator("messages", mode="before")
    @classmethod
    def _some_messages(cls, messages):
        if isinstance(messages, list) and not messages:
            raise refuse("messages", "messages is empty: give at least one message, the last one from the user")
        return messages

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, stop):
        return stop_strings(stop)

    @model_validator(mode="after")
    def _supported(self) -> "ChatCompletionRequest":
        refusals = [
            (self.n != 1, "n", f"only n=1 is supported (one choice per request), got {self.n}"),
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
        roles = [m.role for m in self.messages]
        for i, role in enumerate(roles[1:], start=1):
            if role in ("system", "developer"):
                raise refuse(
                    f"messages[{i}].role",
                    f"a {role} message may only come first (Gemma 4's chat "
                    f"template has one system turn, at the start); messages[{i}] is one",
                )
        last = len(roles) - 1
        if self.continue_final_message or not self.add_generation_prompt:
            if not (self.continue_final_message and not self.add_generation_prompt):
                raise refuse(
                    "continue_final_message",
                    "continue_final_message: true goes with add_generation_prompt: false (and only with it)",
                )
            if roles[-1] != "assistant" or self.messages[-1].tool_calls or not self.messages[-1].content:
                raise refuse(
                    f"messages[{last}].role",
                    "continue_final_message goes on with the last message's text: it must be an assistant's",
                )
            if self.tools or self.response_format:
                raise refuse("continue_final_message", "continue_final_message is not supported with tools or a format")
        elif roles[-1] not in ("user", "tool"):
            raise refuse(
                f"messages[{last}].role",
                f"the last message must be from the user or a tool (it is the "
                f"{roles[-1]}'s): the model answers the last user message, or goes on after a tool's result "
                "(to go on with an assistant's reply, send continue_final_message: true and "
                "add_generation_prompt: false)",
            )
        for i, message in enumerate(self.messages):
            if message.role == "tool" and (not i or roles[i - 1] not in ("assistant", "tool")):
                raise refuse(f"messages[{i}].role", 'a message of role "tool" answers a call: it follows the calls')
        return self

    @property
    def thinking(self) -> bool:
        if self.chat_template_kwargs is not None and self.chat_template_kwargs.enable_thinking is not None:
            return self.chat_template_kwargs.enable_thinking
        return self.reasoning_effort not in (None, "none")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[dict]:
        """The messages as the chat template takes them (developer is the system prompt)."""
        out = []
        for m in self.messages:
            message = {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            extra = {"tool_calls": m.tool_calls, "tool_call_id": m.tool_call_id, "name": m.name}
            out.append({**message, **{k: v for k, v in extra.items() if v is not None}})
        return out
