"""The only module that imports the openai SDK (STYLE.md habit 2).

Chat Completions with function tools, so any OpenAI-compatible server works. The SDK
retries 429 (honouring Retry-After), 5xx, connection errors and timeouts itself, with
backoff, up to ASSISTANT_LLM_MAX_RETRIES; what is still failing after that is an
LLMError the engine can classify.

Rate limits (orchestration/llm/capacity/): the engine asks the shared limiter before each
call, so the SDK does not retry a 429 itself (`_Client`): a 429 is an LLMError with
`rate_limited` and the provider's `retry_after`, and the engine holds every worker's
calls to that model until then. The headers of every answer go to `on_headers`, so the
limiter learns the provider's x-ratelimit-* limits. `endpoint()` names the endpoint (its
base URL and a hash of the key) for the limiter. With ASSISTANT_PROVIDER_LIMITER=0 the SDK
retries 429s on its own, as before.

The engine's loops await `acomplete` (the SDK's async client: a call in flight costs a
coroutine, not a process). It posts the request through the client's own machinery (its
retries, timeouts and errors) but reads the answer as JSON: the typed
`chat.completions.create` walks every message of the request through its TypedDict
transform and builds pydantic models of the answer, 1.5 ms of CPU per call with a long
transcript, and the engine keeps neither.

With `on_text` the call streams (`stream=true`, usage in the last chunk): the text is
handed over as it grows, the tool calls are put together from their fragments, and the
result is the same LLMResponse a plain call gives. A server that answers a streamed
request with a plain completion is read as one; one that refuses streaming (HTTP 400 or
422) is asked again plainly, and not asked to stream again by this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from collections.abc import Awaitable, Callable
from contextlib import contextmanager

import httpx
import openai
from django.conf import settings

from orchestration.llm.base import LLMError, LLMResponse, ToolCall, Usage, pool_closer, pools_connections
from orchestration.llm.capacity.headers import retry_after_seconds
from orchestration.llm.capacity.limiter import Endpoint

OnText = Callable[[str], Awaitable[None]]
OnHeaders = Callable[[dict], None]


def _options() -> tuple[str | None, float, int]:
    return (
        os.environ.get("OPENAI_BASE_URL") or None,
        settings.ASSISTANT_LLM_TIMEOUT_SECONDS,
        settings.ASSISTANT_LLM_MAX_RETRIES,
    )


# An async client's connection pool belongs to the event loop it first ran on: one per
# loop (a worker's runner has one for its whole life), dropped with the loop.
_async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _async_client() -> openai.AsyncOpenAI:
    loop = asyncio.get_running_loop()
    clients = _async_clients.setdefault(loop, {})
    options = _options()
    if options not in clients:
        base_url, timeout, max_retries = options
        # aiohttp's pool hands out a connection in constant time; httpx's scans all of
        # them on every request (18 ms of CPU per call with 100 in flight). Its session
        # must be closed with its loop, so only a loop that lives as long as its process
        # (a runner's) gets one.
        http_client = openai.DefaultAioHttpClient(timeout=timeout) if pools_connections(loop) else None
        client_class = _Client if settings.ASSISTANT_PROVIDER_LIMITER else openai.AsyncOpenAI
        clients[options] = client_class(base_url=base_url, timeout=timeout, max_retries=max_retries,
                                        http_client=http_client)
    return clients[options]


async def _clients_close(loop: asyncio.AbstractEventLoop) -> None:
    """Close the clients kept for `loop` (a runner's, drained); a later call on it would
    open another."""
    for client in _async_clients.pop(loop, {}).values():
        await client.close()


pool_closer(_clients_close)


class _Client(openai.AsyncOpenAI):
    """The SDK's client, except that a 429 is not retried by the SDK: the engine's shared
    limiter holds every worker until the provider's Retry-After instead, so calls do not
    retry at once, each on its own."""

    def _should_retry(self, response: httpx.Response) -> bool:
        return response.status_code != 429 and super()._should_retry(response)


class OpenAIProvider:
    name = "openai"

    def endpoint(self) -> Endpoint:
        """The endpoint its calls go to, as the rate limiter names it."""
        return Endpoint.of(_options()[0], os.environ.get("OPENAI_API_KEY"))

    async def acomplete(self, *, model: str, messages: list[dict], tools: list[dict],
                        on_text: OnText | None = None, max_tokens: int | None = None,
                        on_headers: OnHeaders | None = None) -> LLMResponse:
        body = _body(model, messages, tools, max_tokens)
        if on_text is not None and _may_stream():
            try:
                return await _streamed(body, on_text, on_headers)
            except LLMError as exc:
                if not exc.refused_streaming:
                    raise
                _streaming_refused.add(_options()[0])
        with _as_llm_errors():
            answer = await _async_client().post(COMPLETIONS, body=body, cast_to=httpx.Response)
            if on_headers is not None:
                on_headers(dict(answer.headers))
            return _to_response(answer.json())


COMPLETIONS = "/chat/completions"

# Endpoints (base URLs) that refused a streamed request: asked plainly from then on.
_streaming_refused: set[str | None] = set()


def _may_stream() -> bool:
    return settings.ASSISTANT_LLM_STREAM and _options()[0] not in _streaming_refused


async def _streamed(body: dict, on_text: OnText, on_headers: OnHeaders | None = None) -> LLMResponse:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with _as_llm_errors(streaming=True):
        stream = await _async_client().post(COMPLETIONS, body=body, cast_to=object, stream=True,
                                            stream_cls=openai.AsyncStream[object])
        if on_headers is not None:
            on_headers(dict(stream.response.headers))
        if not stream.response.headers.get("content-type", "").startswith("text/event-stream"):
            return _to_response(json.loads(await stream.response.aread()))  # it answered plainly
        assembled = _Assembly()
        timeout = settings.ASSISTANT_LLM_TIMEOUT_SECONDS
        try:
            # The SDK's timeout covers each read of the socket; this one, a server that
            # keeps the connection alive but sends no chunk.
            async with asyncio.timeout(timeout) as deadline:
                async for chunk in stream:
                    deadline.reschedule(asyncio.get_running_loop().time() + timeout)
                    if assembled.add(chunk):
                        await on_text(assembled.content)
        finally:
            await stream.close()
        return assembled.response()


class _Assembly:
    """A streamed completion put back together from its chunks (dicts, as sent)."""

    def __init__(self):
        self.parts: list[str] = []
        self.content = ""
        self.calls: dict[int, dict] = {}
        self.finish_reason = "stop"
        self.usage: dict = {}
        self.model = ""

    def add(self, chunk) -> bool:
        """Take one chunk in; True if it added text."""
        if not isinstance(chunk, dict):
            raise ValueError("a chunk is not a JSON object")
        self.model = chunk.get("model") or self.model
        self.usage = chunk.get("usage") or self.usage
        added = False
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.parts.append(_text(delta["content"]))
                added = True
            for fragment in delta.get("tool_calls") or []:
                self._add_call(fragment)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if added:
            self.content = "".join(self.parts)
        return added

    def _add_call(self, fragment: dict) -> None:
        call = self.calls.setdefault(fragment.get("index", len(self.calls)), {"id": "", "name": "", "arguments": []})
        call["id"] = fragment.get("id") or call["id"]
        function = fragment.get("function") or {}
        call["name"] += function.get("name") or ""
        call["arguments"].append(_text(function.get("arguments")))

    def response(self) -> LLMResponse:
        message = {"content": self.content, "tool_calls": [
            {"id": call["id"], "function": {"name": call["name"], "arguments": "".join(call["arguments"])}}
            for _, call in sorted(self.calls.items())
        ]}
        completion = {"model": self.model, "usage": self.usage,
                      "choices": [{"message": message, "finish_reason": self.finish_reason}]}
        return _to_response(completion)


def _body(model: str, messages: list[dict], tools: list[dict], max_tokens: int | None) -> dict:
    """`max_tokens`, the field every compatible server reads (OpenAI's reasoning models
    want `max_completion_tokens` instead), only when the spend cap bounds the answer."""
    return {"model": model, "messages": messages, **({"tools": tools} if tools else {}),
            **({"max_tokens": max_tokens} if max_tokens is not None else {})}


@contextmanager
def _as_llm_errors(*, streaming: bool = False):
    """The SDK's exceptions as LLMErrors that say whether trying again may help (and,
    for a streamed request, whether the server refused to stream)."""
    try:
        yield
    except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
        error = LLMError(f"LLM error {exc.status_code}: {exc.message}", transient=False)
        error.refused_streaming = streaming
        raise error from exc
    except (httpx.HTTPError, asyncio.TimeoutError) as exc:  # the stream broke off or stalled
        raise LLMError(f"LLM stream interrupted: {exc!r}", transient=True) from exc
    except (openai.APITimeoutError, openai.APIConnectionError) as exc:
        raise LLMError(f"LLM endpoint unreachable: {exc}", transient=True) from exc
    except openai.RateLimitError as exc:
        headers = dict(exc.response.headers)
        if _out_of_quota(exc):  # billing, not speed: waiting does not help
            raise LLMError(f"LLM quota exhausted: {exc}", transient=False, headers=headers) from exc
        raise LLMError(f"LLM rate limit: {exc}", transient=True, rate_limited=True,
                       retry_after=retry_after_seconds(headers), headers=headers) from exc
    except openai.APIStatusError as exc:
        transient = exc.status_code >= 500 or exc.status_code in (408, 409)
        raise LLMError(f"LLM error {exc.status_code}: {exc.message}", transient=transient) from exc
    except (openai.OpenAIError, ValueError, TypeError, AttributeError) as exc:  # a body that is not a completion
        raise LLMError(f"LLM response unusable: {exc}", transient=True) from exc


def _out_of_quota(exc: openai.RateLimitError) -> bool:
    """OpenAI answers an exhausted quota with a 429 too (code insufficient_quota)."""
    return getattr(exc, "code", None) == "insufficient_quota"


def _text(value) -> str:
    """A text field; one a server sent as JSON (arguments as an object) as its JSON text."""
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)


def _to_response(completion: dict) -> LLMResponse:
    """A Chat Completions answer (JSON) as the engine's response; anything else is a
    ValueError (or a TypeError or AttributeError on a field of the wrong shape)."""
    if not isinstance(completion, dict):
        raise ValueError("the answer is not a JSON object")
    usage = completion.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    stored_usage = Usage(
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or 0,
        cached_tokens=details.get("cached_tokens") or 0,
    )
    model = completion.get("model") or ""
    if not completion.get("choices"):
        return LLMResponse(content="", finish_reason="empty", usage=stored_usage, model=model)
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    calls = [
        ToolCall(id=str(call.get("id") or f"call_{index}"), name=str(call["function"].get("name") or ""),
                 arguments=_text(call["function"].get("arguments")))
        for index, call in enumerate(message.get("tool_calls") or [])
        if call.get("function") is not None
    ]
    return LLMResponse(
        content=_text(message.get("content")),
        tool_calls=calls,
        finish_reason=choice.get("finish_reason") or "stop",
        usage=stored_usage,
        model=model,
    )
