"""Request bodies and response objects of the OpenAI-compatible generation endpoints.

Requests are validated strictly (no type coercion, unknown arguments refused), as OpenAI's API
does; what wmark cannot honour (n > 1, stop sequences, penalties) is refused rather than ignored.
So are values no sampler should meet: NaN and infinities (Python's JSON reads them), subnormal
numbers, a temperature under `MIN_TEMPERATURE`, and text that is not Unicode (a lone surrogate,
which JSON's `\ud800` escapes can carry but no UTF-8 tokenizer or digest can take).
Responses follow OpenAI's chat.completion / text_completion objects and their stream chunks,
with wmark's own fields under the extension field `wmark`.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "MIN_TEMPERATURE",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "completion_object",
    "error_chunk",
    "response_id",
    "sse",
    "usage",
]

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
# Below this, sampling is greedy for all purposes (a logit gap of 0.1 becomes a factor of e^10)
# and the text carries next to no watermark; at subnormal temperatures 1/T overflows and the
# sampler's distribution is NaN. vLLM raises such temperatures to this same 0.01.
MIN_TEMPERATURE = 0.01
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(text: str) -> str:
    if _SURROGATE.search(text):
        raise ValueError("text must be valid Unicode: a lone surrogate (U+D800..U+DFFF) is not")
    return text


def _normal(value: float | None) -> float | None:
    if value is not None and 0 < abs(value) < sys.float_info.min:
        raise ValueError("subnormal numbers are not accepted")
    return value


Text = Annotated[str, AfterValidator(_unicode)]


class TextPart(BaseModel):
    """A text part of a message's content (the only kind a text model takes)."""

    model_config = _STRICT
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """One message of the conversation."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | Annotated[list[TextPart], Field(fail_fast=True)]  # one error, not one a part
    name: Text | None = None

    def text(self) -> str:
        """The content as one string."""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    """`stream_options`: a last chunk with the usage counts."""

    model_config = _STRICT
    include_usage: bool = False


class _Sampling(BaseModel):
    """What both endpoints take."""

    model_config = _STRICT
    model: Annotated[Text, Field(min_length=1, max_length=200)]
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    temperature: Annotated[float | None, Field(ge=MIN_TEMPERATURE, le=2.0)] = None
    top_p: Annotated[float | None, Field(gt=0.0, le=1.0), AfterValidator(_normal)] = None
    seed: int | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: None = None
    presence_penalty: Annotated[float | None, Field(ge=0.0, le=0.0)] = None
    frequency_penalty: Annotated[float | None, Field(ge=0.0, le=0.0)] = None
    user: Annotated[Text | None, Field(max_length=256)] = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError("only n = 1 is supported (one watermarked choice per request)")
        return n

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, seed: int | None) -> int | None:
        if seed is not None and not -(2**63) <= seed < 2**63:
            raise ValueError("seed must fit in 64 bits")
        return seed


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1000, fail_fast=True)]
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None

    @field_validator("messages")
    @classmethod
    def _has_text(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.text().strip() for m in messages):
            raise ValueError("every message is empty")
        return messages

    def budget(self) -> int | None:
        """The token budget asked for (max_completion_tokens, OpenAI's newer name, wins)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def prompt_chars(self) -> int:
        """Characters of all the contents (what the chat template adds not counted)."""
        return sum(len(m.text()) for m in self.messages)

    def digest_source(self) -> str:
        """The canonical JSON of the messages, whose SHA-256 the audit row keeps."""
        plain = [{"role": m.role, "content": m.text()} for m in self.messages]
        return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class CompletionRequest(_Sampling):
    """POST /v1/completions (a raw prompt, no chat template)."""

    prompt: Annotated[Text | Annotated[list[Text], Field(fail_fast=True)], Field(min_length=1)]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("give one prompt (a string, or a list of one string)")
        text = prompt if isinstance(prompt, str) else prompt[0]
        if not text.strip():
            raise ValueError("the prompt is empty")
        return prompt

    def budget(self) -> int | None:
        """The token budget asked for."""
        return self.max_tokens

    def prompt_chars(self) -> int:
        """Characters of the prompt."""
        return len(self.digest_source())

    def digest_source(self) -> str:
        """The prompt, whose SHA-256 the audit row keeps."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def response_id(chat: bool) -> str:
    """A fresh id like OpenAI's (`chatcmpl-...` or `cmpl-...`)."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _choice(chat: bool, *, text: str, finish_reason: str | None, chunk: bool, role: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if not chunk:
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
    delta: dict[str, str] = {"role": "assistant"} if role else {}
    if text or role:
        delta["content"] = text
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def completion_object(
    chat: bool,
    *,
    id: str,
    created: int,
    model: str,
    text: str = "",
    finish_reason: str | None = None,
    chunk: bool = False,
    usage: dict[str, int] | None = None,
    wmark: dict[str, Any] | None = None,
    choices: bool = True,
    role: bool = False,
) -> dict[str, Any]:
    """A chat.completion / text_completion, or (chunk=True) one of their stream chunks.

    Args:
        chat: chat completion (else text completion).
        text: the content (a chunk's: the new text).
        finish_reason: "stop" or "length" on the last choice, else None.
        chunk: a stream chunk.
        usage: the usage object (the whole response; a stream's usage-only chunk).
        wmark: the extension field (key id, AATPS, audit row ...).
        choices: False for a stream's usage-only chunk (its choices are empty).
        role: a chat stream's first chunk (its delta names the assistant role).
    """
    kind = "chat.completion" if chat else "text_completion"
    body: dict[str, Any] = {
        "id": id,
        "object": f"{kind}.chunk" if chunk and chat else kind,
        "created": created,
        "model": model,
        "choices": [_choice(chat, text=text, finish_reason=finish_reason, chunk=chunk, role=role)]
        if choices
        else [],
    }
    if usage is not None:
        body["usage"] = usage
    if wmark is not None:
        body["wmark"] = wmark
    return body


def error_chunk(message: str, type_: str, code: str) -> dict[str, Any]:
    """What a stream sends when the generation fails after the response has started."""
    return {"error": {"message": message, "type": type_, "code": code, "param": None}}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event, as OpenAI's API streams them (`data: ...` and a blank line)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
