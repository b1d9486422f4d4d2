"""The only module that imports the openai SDK (STYLE.md habit 2).

Chat Completions with function tools, so any OpenAI-compatible server works. The SDK
retries 429 (honouring Retry-After), 5xx, connection errors and timeouts itself, with
backoff, up to ASSISTANT_LLM_MAX_RETRIES; what is still failing after that is an
LLMError the engine can classify.

The engine's loops await `acomplete` (the SDK's async client: a call in flight costs a
coroutine, not a process); `complete` is the same call for synchronous callers.
"""

from __future__ import annotations

import asyncio
import functools
import os
import weakref
from contextlib import contextmanager

import openai
from django.conf import settings

from orchestration.llm.base import LLMError, LLMResponse, ToolCall, Usage


def _options() -> tuple[str | None, float, int]:
    return (
        os.environ.get("OPENAI_BASE_URL") or None,
        settings.ASSISTANT_LLM_TIMEOUT_SECONDS,
        settings.ASSISTANT_LLM_MAX_RETRIES,
    )


def _client() -> openai.OpenAI:
    return _client_for(*_options())


@functools.lru_cache(maxsize=4)
def _client_for(base_url: str | None, timeout: float, max_retries: int) -> openai.OpenAI:
    # Built lazily in the process that uses it (worker processes must not share the
    # connection pool of a parent they were forked from), then reused for its keep-alive.
    return openai.OpenAI(base_url=base_url, timeout=timeout, max_retries=max_retries)


# An async client's connection pool belongs to the event loop it first ran on: one per
# loop (a worker's runner has one for its whole life), dropped with the loop.
_async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _async_client() -> openai.AsyncOpenAI:
    loop = asyncio.get_running_loop()
    clients = _async_clients.setdefault(loop, {})
    options = _options()
    if options not in clients:
        base_url, timeout, max_retries = options
        clients[options] = openai.AsyncOpenAI(base_url=base_url, timeout=timeout, max_retries=max_retries)
    return clients[options]


class OpenAIProvider:
    name = "openai"

    def complete(self, *, model: str, messages: list[dict], tools: list[dict]) -> LLMResponse:
        with _as_llm_errors():
            completion = _client().chat.completions.create(
                model=model, messages=messages, tools=tools or openai.NOT_GIVEN
            )
        return _to_response(completion)

    async def acomplete(self, *, model: str, messages: list[dict], tools: list[dict]) -> LLMResponse:
        with _as_llm_errors():
            completion = await _async_client().chat.completions.create(
                model=model, messages=messages, tools=tools or openai.NOT_GIVEN
            )
        return _to_response(completion)


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
    except (openai.OpenAIError, ValueError, TypeError) as exc:  # a body that is not a completion
        raise LLMError(f"LLM response unusable: {exc}", transient=True) from exc


def _to_response(completion) -> LLMResponse:
    usage = completion.usage
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    stored_usage = Usage(
        prompt_tokens=(usage.prompt_tokens or 0) if usage else 0,
        completion_tokens=(usage.completion_tokens or 0) if usage else 0,
        cached_tokens=(getattr(details, "cached_tokens", 0) or 0) if details else 0,
    )
    if not completion.choices:
        return LLMResponse(content="", finish_reason="empty", usage=stored_usage, model=completion.model or "")
    choice = completion.choices[0]
    message = choice.message
    calls = [
        ToolCall(id=call.id or f"call_{index}", name=call.function.name or "", arguments=call.function.arguments or "")
        for index, call in enumerate(message.tool_calls or [])
        if getattr(call, "function", None) is not None
    ]
    return LLMResponse(
        content=message.content or "",
        tool_calls=calls,
        finish_reason=choice.finish_reason or "stop",
        usage=stored_usage,
        model=completion.model or "",
    )
