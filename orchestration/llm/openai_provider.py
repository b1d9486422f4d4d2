"""The only module that imports the openai SDK (STYLE.md habit 2).

Chat Completions with function tools, so any OpenAI-compatible server works. The SDK
retries 429 (honouring Retry-After), 5xx, connection errors and timeouts itself, with
backoff, up to ASSISTANT_LLM_MAX_RETRIES; what is still failing after that is an
LLMError the engine can classify.

The engine's loops await `acomplete` (the SDK's async client: a call in flight costs a
coroutine, not a process). It posts the request through the client's own machinery (its
retries, timeouts and errors) but reads the answer as JSON: the typed
`chat.completions.create` walks every message of the request through its TypedDict
transform and builds pydantic models of the answer, 1.5 ms of CPU per call with a long
transcript, and the engine keeps neither.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from contextlib import contextmanager

import httpx
import openai
from django.conf import settings

from orchestration.llm.base import LLMError, LLMResponse, ToolCall, Usage, pools_connections


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
        clients[options] = openai.AsyncOpenAI(base_url=base_url, timeout=timeout, max_retries=max_retries,
                                              http_client=http_client)
    return clients[options]


class OpenAIProvider:
    name = "openai"

    async def acomplete(self, *, model: str, messages: list[dict], tools: list[dict]) -> LLMResponse:
        with _as_llm_errors():
            answer = await _async_client().post(COMPLETIONS, body=_body(model, messages, tools), cast_to=httpx.Response)
            return _to_response(answer.json())


COMPLETIONS = "/chat/completions"


def _body(model: str, messages: list[dict], tools: list[dict]) -> dict:
    return {"model": model, "messages": messages, **({"tools": tools} if tools else {})}


@contextmanager
def _as_llm_errors():
    """The SDK's exceptions as LLMErrors that say whether trying again may help."""
    try:
        yield
    except (openai.APITimeoutError, openai.APIConnectionError) as exc:
        raise LLMError(f"LLM endpoint unreachable: {exc}", transient=True) from exc
    except openai.RateLimitError as exc:
        raise LLMError(f"LLM rate limit: {exc}", transient=True) from exc
    except openai.APIStatusError as exc:
        transient = exc.status_code >= 500 or exc.status_code in (408, 409)
        raise LLMError(f"LLM error {exc.status_code}: {exc.message}", transient=transient) from exc
    except (openai.OpenAIError, ValueError, TypeError, AttributeError) as exc:  # a body that is not a completion
        raise LLMError(f"LLM response unusable: {exc}", transient=True) from exc


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
