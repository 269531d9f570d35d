"""POST /v1/chat/completions and /v1/completions (OpenAI-compatible, watermarked), GET /v1/models.

Each request is checked (model name, limits, the server's key) before it queues, so bad input
gets a 4xx and never a broken stream. A prompt longer in characters than `max_prompt_tokens`
tokens can hold is refused before it is tokenised (`_check_characters`); the others are tokenised
on the generation's own small pool. Then the request waits for the model pair (`Generation`),
and nothing is answered until the generation emits its first tokens: whatever ends it before
that (a revoked token or key, a failure) is an HTTP error in OpenAI's shape. The answer comes
whole or, with `stream: true`, as server-sent events exactly as OpenAI's API sends them, ending
with `data: [DONE]`; a stream that cannot finish (a revocation, a failure) ends with an error
event instead. A client that goes away cancels its generation at the next block. wmark's
fields (key id, AATPS, method, audit row) are in the extension field `wmark`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from wmark.api.deps import AdmittedRoute, decoded_body, require
from wmark.api.errors import DATABASE_UNAVAILABLE
from wmark.api.generate_settings import GenerationSettings
from wmark.api.generation import Generation
from wmark.api.generation_job import Event, Failed, Finished, Job, Tokens, served_sampler
from wmark.api.openai_errors import error_type
from wmark.api.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    completion_object,
    error_chunk,
    response_id,
    sse,
    usage,
)
from wmark.errors import InputError, WmarkError
from wmark.generator.text_stream import TextStream
from wmark.keys.audit import text_digest
from wmark.keys.tokens import TokenInfo

__all__ = ["OPENAI_PATHS", "router"]

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")

T = TypeVar("T")
router = APIRouter(route_class=AdmittedRoute, tags=["generate"])
GeneratorToken = Annotated[TokenInfo, Depends(require("generator"))]

_FINISH = {"eos": "stop", "length": "length"}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Malformed request, or past the configured limits"},
    401: {"description": "Missing or invalid token"},
    403: {"description": "The token's role may not generate"},
    404: {"description": "Unknown model"},
    429: {"description": "Rate limit, or the generation queue is full (see Retry-After)"},
}


class ModelNotFound(WmarkError):
    """The request names a model this server does not serve."""

    code = "model_not_found"
    status = 404


class LimitExceeded(InputError):
    """The prompt or the token budget is past the server's limits."""

    code = "context_length_exceeded"
    status = 400


class BelowFloor(InputError):
    """The request's temperature or top-p leaves too little randomness to carry the watermark."""

    code = "sampling_below_floor"
    status = 400


MAX_CONTENT_PARTS = 1024
"""Text parts a chat request's messages may hold in all. Checked on the decoded body before
validation (`bounded_chat`), which takes ~3 us a part on the event loop: 40 requests of 32,000
empty parts each (960 KB, under the body limit) held every other route for ~4 s."""


async def bounded_chat(request: Request) -> None:
    """POST /v1/chat/completions's content parts within `MAX_CONTENT_PARTS` (a dependency after
    admission, which FastAPI resolves before it validates the body)."""
    body = await decoded_body(request)
    messages = body.get("messages") if isinstance(body, dict) else None
    parts = sum(
        len(content)
        for message in (messages if isinstance(messages, list) else [])
        if isinstance(message, dict) and isinstance(content := message.get("content"), list)
    )
    if parts > MAX_CONTENT_PARTS:
        raise LimitExceeded(f"the messages hold {parts} content parts; the limit is {MAX_CONTENT_PARTS}")


def _sampling(
    body: ChatCompletionRequest | CompletionRequest, settings: GenerationSettings
) -> tuple[float, float]:
    """The request's temperature and top-p (1 where not given), refused below the server's floors."""
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    for name, value, floor, variable in (
        ("temperature", temperature, settings.min_temperature, "TEMPERATURE"),
        ("top_p", top_p, settings.min_top_p, "TOP_P"),
    ):
        if value < floor:
            raise BelowFloor(
                f"{name} {value:g} is below this server's floor {floor:g}: the text would keep too little "
                f"randomness to carry the watermark (the operator sets WMARK_GENERATE_MIN_{variable})"
            )
    return temperature, top_p


async def get_generation(request: Request) -> Generation:
    """The app's generation service."""
    generation: Generation = request.app.state.generation
    return generation


GenerationDep = Annotated[Generation, Depends(get_generation)]


@router.get("/v1/models", responses=_ERRORS)
async def list_models(_token: GeneratorToken, generation: GenerationDep) -> dict[str, Any]:
    """The one model this server generates with."""
    return {
        "object": "list",
        "data": [
            {"id": generation.settings.model_name, "object": "model", "created": 0, "owned_by": "wmark"}
        ],
    }


@router.post("/v1/chat/completions", responses=_ERRORS)
async def chat_completions(
    body: ChatCompletionRequest,
    token: GeneratorToken,
    _bounded: Annotated[None, Depends(bounded_chat)],
    generation: GenerationDep,
    request: Request,
) -> Response:
    """Watermarked chat completion (the target's chat template, then the server's sampler and key).

    A message's content is text: control-token text in it (`<|im_end|>` ...) is encoded as plain
    text, never as the control token (the template's own are the only ones).
    """
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    return await _complete(
        generation, body, token, request, chat=True, encode=lambda: generation.pair.encode_messages(messages)
    )


@router.post("/v1/completions", responses=_ERRORS)
async def completions(
    body: CompletionRequest, token: GeneratorToken, generation: GenerationDep, request: Request
) -> Response:
    """Watermarked completion of a raw prompt (no chat template)."""
    prompt = body.digest_source()
    return await _complete(
        generation,
        body,
        token,
        request,
        chat=False,
        encode=lambda: generation.pair.encode_prompt(prompt, chat=False),
    )


async def _complete(
    generation: Generation,
    body: ChatCompletionRequest | CompletionRequest,
    token: TokenInfo,
    request: Request,
    *,
    chat: bool,
    encode: Callable[[], list[int]],
) -> Response:
    settings = generation.settings
    if body.model != settings.model_name:
        raise ModelNotFound(f"this server generates with model {settings.model_name!r} only")
    temperature, top_p = _sampling(body, settings)
    budget = body.budget() or settings.max_tokens
    if budget > settings.max_tokens:
        raise LimitExceeded(f"max_tokens is {budget}; this server allows at most {settings.max_tokens}")
    _check_characters(
        body.prompt_chars(), settings.max_prompt_tokens, generation.pair.prompts.max_token_chars
    )
    generation.ensure_room(token.token_id)
    prompt_ids = await generation.tokenise(encode)
    if len(prompt_ids) > settings.max_prompt_tokens:
        raise LimitExceeded(
            f"the prompt has {len(prompt_ids)} tokens; the limit is {settings.max_prompt_tokens}"
        )
    key = await run_in_threadpool(generation.key)
    job = Job(
        prompt_ids=prompt_ids,
        config=served_sampler(
            generation.settings,
            max_tokens=budget,
            temperature=temperature,
            top_p=top_p,
        ),
        key=key,
        seed=body.seed,
        token_id=token.token_id,
        audit={
            "endpoint": request.url.path,
            "prompt_sha256": text_digest(body.digest_source()),
        },
        stream=body.stream,
    )
    generation.submit(job)
    first = await _unless_disconnected(job.events.get(), request)
    if first is None:
        job.cancel()
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it
    if isinstance(first, Failed):  # nothing was generated: an HTTP error
        raise first.error
    reply = _Reply(chat=chat, model=settings.model_name or "", decode=generation.pair.decode)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return _GenerationStream(
            job,
            _stream(job, first, reply, include_usage=include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    finished = first if isinstance(first, Finished) else await _unless_disconnected(job.finished(), request)
    if finished is None:
        job.cancel()
        return Response(status_code=499)
    return JSONResponse(reply.whole(finished))


def _check_characters(chars: int, max_tokens: int, max_token_chars: int) -> None:
    """Refuse, before tokenising it, a prompt whose contents have more characters than
    `max_tokens` tokens can cover.

    Every character of a text is covered by some token, and no token covers more characters
    than the vocabulary's longest token has (a byte-level token's characters are bytes, and a
    character is at least one byte): so such a prompt has more tokens than allowed, whatever it
    says, and tokenising it (seconds for a megabyte) would only confirm that. A tokenizer that
    drops characters (whitespace between words, control characters) could fit more characters
    into its tokens; refusing those prompts loses nothing but what it would have dropped.
    """
    limit = max_tokens * max_token_chars
    if chars > limit:
        raise LimitExceeded(
            f"the prompt has {chars} characters; {max_tokens} tokens of this model hold at most {limit}"
        )


class _Reply:
    """Builds one request's response objects, and its text as the tokens come."""

    def __init__(self, *, chat: bool, model: str, decode: Callable[[Sequence[int]], str]) -> None:
        self.chat = chat
        self.model = model
        self.id = response_id(chat)
        self.created = int(time.time())
        self.text = TextStream(decode)  # the streamed text, delta by delta

    def chunk(self, text: str = "", **fields: Any) -> dict[str, Any]:
        """A stream chunk."""
        return completion_object(
            self.chat, id=self.id, created=self.created, model=self.model, text=text, chunk=True, **fields
        )

    def whole(self, finished: Finished) -> dict[str, Any]:
        """The non-streamed response."""
        result = finished.result
        return completion_object(
            self.chat,
            id=self.id,
            created=self.created,
            model=self.model,
            text=result.text,
            finish_reason=_FINISH.get(result.stop_reason, "stop"),
            usage=usage(len(result.prompt_ids), len(result.token_ids)),
            wmark=_extension(finished),
        )


def _extension(finished: Finished) -> dict[str, Any]:
    result = finished.result
    return {
        "key_id": result.key_id,
        "aatps": round(result.aatps, 4),
        "method": result.method,
        "tokens_per_s": round(result.tokens_per_s, 2),
        "audit_seq": finished.audit_seq,
    }


class _GenerationStream(StreamingResponse):
    """A streamed generation that is cancelled whenever its response ends, however it ends.

    When the client goes away, Starlette cancels the response; if that happens while it is
    sending (not waiting inside the event generator), the generator stays suspended at a
    `yield` and its `finally` would only run when it is garbage-collected, leaving the model
    busy for a client that is gone. Cancelling here does not depend on that.
    """

    def __init__(self, job: Job, content: AsyncIterator[bytes], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _stream(job: Job, first: Event, reply: _Reply, *, include_usage: bool) -> AsyncIterator[bytes]:
    """The server-sent events of one generation, from its `first` event on (`_GenerationStream`
    cancels the job when the response ends; the `finally` here covers a generator closed first)."""
    try:
        if reply.chat:
            yield sse(reply.chunk(role=True))
        async for event in _events(job, first):
            if isinstance(event, Tokens):
                text = reply.text.delta(event.ids)
                if text:
                    yield sse(reply.chunk(text))
                continue
            if isinstance(event, Failed):  # as the non-streamed route answers it (`Failed`)
                error = event.error
                if isinstance(error, WmarkError):
                    status, code, message = error.status, error.code, str(error)
                else:  # the database's error: the worker lets no other kind through
                    status, code, message = DATABASE_UNAVAILABLE
                yield sse(error_chunk(message, error_type(status), code))
                return
            assert isinstance(event, Finished)
            result = event.result
            finish = _FINISH.get(result.stop_reason, "stop")
            yield sse(
                reply.chunk(reply.text.rest(result.text), finish_reason=finish, wmark=_extension(event))
            )
            if include_usage:
                yield sse(
                    reply.chunk(usage=usage(len(result.prompt_ids), len(result.token_ids)), choices=False)
                )
            yield sse("[DONE]")
            return
    finally:
        job.cancel()


async def _events(job: Job, first: Event) -> AsyncIterator[Event]:
    """`first`, then the job's events up to its end."""
    event = first
    yield event
    while not isinstance(event, Finished | Failed):
        event = await job.events.get()
        yield event


async def _unless_disconnected(work: Awaitable[T], request: Request) -> T | None:
    """`work`'s result, or None if the client disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None
