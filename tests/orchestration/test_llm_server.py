"""The scripted model server is no kinder than a provider: an answer longer than the
request's `max_tokens` stops there, plain or streamed, as the spend cap relies on
(issue 24). Through the real SDK and the engine's provider, which sends the bound."""

from __future__ import annotations

import json

import pytest

from orchestration.llm.base import Usage
from orchestration.llm.openai_provider import OpenAIProvider
from tests.support.llm_server import calls, text

LONG = "Every word of it, at length. " * 200  # 5,800 characters: some 1,450 tokens
ASK = [{"role": "user", "content": "Tell me everything."}]
STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])


async def ask(max_tokens: int | None, streamed: bool) -> tuple:
    drafts: list[str] = []

    async def on_text(text_so_far: str) -> None:
        drafts.append(text_so_far)

    response = await OpenAIProvider().acomplete(model="scripted", messages=ASK, tools=[], max_tokens=max_tokens,
                                                on_text=on_text if streamed else None)
    return response, drafts


@STREAMED
async def test_a_longer_answer_stops_at_max_tokens(llm, streamed):
    llm.respond = lambda request: text(LONG, usage=(40, 1450, 0))
    response, drafts = await ask(100, streamed)
    assert [(request["max_tokens"], bool(request.get("stream"))) for request in llm.requests] == [(100, streamed)]
    assert response.content == LONG[:400] and response.finish_reason == "length"
    assert response.usage == Usage(prompt_tokens=40, completion_tokens=100)
    assert drafts[-1:] == ([LONG[:400]] if streamed else [])


@STREAMED
async def test_an_answer_whose_count_is_long_stops_too(llm, streamed):
    """A short text the script says took many tokens (say, reasoning) is cut all the same."""
    llm.respond = lambda request: text("Short.", usage=(40, 5000, 0))
    response, _ = await ask(300, streamed)
    assert (response.content, response.finish_reason, response.usage.completion_tokens) == ("Short.", "length", 300)


@STREAMED
async def test_a_tool_call_is_cut_mid_arguments_and_later_ones_never_come(llm, streamed):
    first, second = {"skill": "files.write", "arguments": {"text": "a" * 1000}}, {"skill": "tasks.search"}
    llm.respond = lambda request: calls(("use_skill", first), ("use_skill", second))
    response, _ = await ask(50, streamed)
    [call] = response.tool_calls
    assert call.arguments == json.dumps(first)[:200] and response.finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(call.arguments)


@STREAMED
async def test_an_answer_within_the_bound_or_without_one_is_whole(llm, streamed):
    llm.respond = lambda request: text(LONG, usage=(40, 1450, 0))
    response, _ = await ask(None, streamed)
    assert "max_tokens" not in llm.requests[0]
    assert (response.content, response.finish_reason, response.usage.completion_tokens) == (LONG, "stop", 1450)
    response, _ = await ask(2000, streamed)
    assert (response.content, response.finish_reason, response.usage.completion_tokens) == (LONG, "stop", 1450)
