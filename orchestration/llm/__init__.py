"""LLM providers behind one small interface: `await acomplete(model=, messages=, tools=)`,
`on_text=` for a call whose text the caller wants as it is written (a provider that
cannot stream answers whole and never calls it), and `max_tokens=` for the most the
answer may use (the spend cap's allowance: the answer stops there, finish_reason
"length"; None: no bound is asked)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from django.conf import settings

from orchestration.llm.base import LLMError, LLMResponse, ToolCall, Usage

__all__ = ["LLMError", "LLMResponse", "Provider", "ToolCall", "Usage", "get_provider"]


class Provider(Protocol):
    name: str

    async def acomplete(self, *, model: str, messages: list[dict], tools: list[dict],
                        on_text: Callable[[str], Awaitable[None]] | None = None,
                        max_tokens: int | None = None) -> LLMResponse: ...


def get_provider() -> Provider:
    if settings.ASSISTANT_LLM_PROVIDER == "openai":
        from orchestration.llm.openai_provider import OpenAIProvider

        return OpenAIProvider()
    from orchestration.llm.offline import OfflineProvider

    return OfflineProvider()
