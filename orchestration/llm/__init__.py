"""LLM providers behind one small interface: `await acomplete(model=, messages=, tools=)`."""

from __future__ import annotations

from typing import Protocol

from django.conf import settings

from orchestration.llm.base import LLMError, LLMResponse, ToolCall, Usage

__all__ = ["LLMError", "LLMResponse", "Provider", "ToolCall", "Usage", "get_provider"]


class Provider(Protocol):
    name: str

    async def acomplete(self, *, model: str, messages: list[dict], tools: list[dict]) -> LLMResponse: ...


def get_provider() -> Provider:
    if settings.ASSISTANT_LLM_PROVIDER == "openai":
        from orchestration.llm.openai_provider import OpenAIProvider

        return OpenAIProvider()
    from orchestration.llm.offline import OfflineProvider

    return OfflineProvider()
