"""The scripted model server is no kinder than a provider: an answer longer than the
request's `max_tokens` stops there, plain or streamed, as the spend cap relies on
(issue 24); past its rate limits it answers 429 as OpenAI does, with the body and the
headers the SDK reads (issue 26). Through the real SDK and the engine's provider."""

from __future__ import annotations

import functools
import json
import re
import threading
import time

import openai
import pytest

from orchestration.llm.base import Usage
from orchestration.llm.openai_provider import OpenAIProvider
from tests.support.llm_server import (RateLimit, ScriptedLLM, calls, duration, request_tokens, text,
                                       with_burst)

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


# --- rate limits, as a provider enforces them (issue 26) ------------------------------------
# Through the real SDK: the 429's body and headers are what it parses.

@functools.cache
def _client(url: str, key: str, retries: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=retries)


def client(llm, key: str = "key-a", retries: int = 0) -> openai.OpenAI:
    """One per server, key and retries: its connection is kept, so calls take a millisecond."""
    return _client(llm.url, key, retries)


def ask_model(llm, key: str = "key-a", *, prompt: str = "Hi.", max_tokens: int | None = None, retries: int = 0,
              stream: bool = False):
    options = {"max_tokens": max_tokens} if max_tokens else {}
    return client(llm, key, retries).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], stream=stream, **options)


def test_past_the_requests_burst_the_sdk_gets_a_rate_limit_error_with_retry_after(llm):
    llm.respond = lambda request: text("ok")
    llm.rate_limit = RateLimit(rpm=60, burst_requests=10)  # 10 at once, then one a second
    for _ in range(10):
        ask_model(llm)
    with pytest.raises(openai.RateLimitError) as refused:
        ask_model(llm)
    error = refused.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded" and error.type == "requests"
    assert "Limit 60," in error.message and "Please try again in" in error.message
    headers = error.response.headers
    assert headers["retry-after"] == "1"  # under a second to the next request, in whole seconds
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("60", "0")
    assert re.fullmatch(r"9\.\d+s", headers["x-ratelimit-reset-requests"])  # until the burst is whole again
    assert "x-ratelimit-limit-tokens" not in headers  # no token limit set
    assert llm.rate_limited == 1 and len(llm.requests) == 11
    refusal = llm.answers[-1]
    assert (refusal.status, refusal.refused, refusal.key, refusal.index) == (429, "requests", "key-a", 10)
    assert refusal.arrived <= refusal.answered < refusal.arrived + 0.1  # at once, without the model's latency
    assert [index for index, _, _ in llm.timeline] == list(range(11))


def test_the_rate_refills_the_burst(llm):
    llm.respond = lambda request: text("ok")
    # Two a second: a request refills in 0.5 s, far longer than a call takes on a busy machine,
    # so no request is refilled between two calls the test means to be back to back.
    llm.rate_limit = RateLimit(rpm=120, burst_requests=2, retry_after_ms=True)
    ask_model(llm), ask_model(llm)
    with pytest.raises(openai.RateLimitError) as refused:
        ask_model(llm)
    assert 0 < int(refused.value.response.headers["retry-after-ms"]) <= 500
    time.sleep(0.55)
    ask_model(llm)
    # The SDK honours retry-after-ms: with one retry of its own, the next call gets through.
    started = time.monotonic()
    assert ask_model(llm, retries=1).parse().choices[0].message.content == "ok"
    assert 0.3 < time.monotonic() - started < 2
    assert [a.status for a in llm.answers] == [200, 200, 429, 200, 429, 200]


def test_tokens_are_charged_on_arrival_prompt_and_allowance(llm):
    llm.respond = lambda request: text("ok")
    llm.rate_limit = RateLimit(tpm=6_000, burst_tokens=3_000, default_max_tokens=1_000)  # 100 a second
    prompt = "x" * 400  # 100 tokens at 4 characters a token
    ask_model(llm, prompt=prompt, max_tokens=900)  # 1,000
    ask_model(llm, prompt=prompt)  # 100 + the default allowance, 1,000: 1,100
    response = ask_model(llm, prompt=prompt, max_tokens=400)  # 500
    assert [a.tokens for a in llm.answers] == [1_000, 1_100, 500]
    headers = response.headers
    assert headers["x-ratelimit-limit-tokens"] == "6000"
    assert 400 <= int(headers["x-ratelimit-remaining-tokens"]) < 410  # and what refilled meanwhile
    assert re.fullmatch(r"2\ds|2\d\.\d+s", headers["x-ratelimit-reset-tokens"])  # 2,600 tokens at 100 a second
    with pytest.raises(openai.RateLimitError) as refused:
        ask_model(llm, prompt=prompt, max_tokens=900)
    assert refused.value.type == "tokens" and "TPM" in refused.value.message
    assert refused.value.response.headers["retry-after"] == "6"  # 600 more tokens at 100 a second
    assert llm.answers[-1].refused == "tokens" and llm.answers[-1].tokens == 0


def test_a_request_larger_than_the_burst_passes_when_it_is_whole_and_leaves_a_debt(llm):
    llm.respond = lambda request: text("ok")
    llm.rate_limit = RateLimit(tpm=6_000, burst_tokens=500)  # 100 tokens a second
    ask_model(llm, prompt="x" * 4000, max_tokens=500)  # 1,500 tokens: the bucket is 1,000 in debt
    with pytest.raises(openai.RateLimitError) as refused:
        ask_model(llm, max_tokens=100)
    # the 1,000 owed and the 101 asked for ("Hi.", 1 token, and 100), at 100 a second: 11.01 s,
    # less what the bucket refilled between the two requests (past 10 ms on a busy machine)
    assert refused.value.response.headers["retry-after"] in ("11", "12")


def test_every_answer_under_a_limit_says_what_is_left_plain_or_streamed(llm):
    llm.respond = lambda request: text("A streamed answer.")
    llm.rate_limit = RateLimit(rpm=60, tpm=100_000, burst_requests=5, burst_tokens=10_000)
    plain = ask_model(llm, max_tokens=100)
    streamed = ask_model(llm, max_tokens=100, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed.parse() if chunk.choices) == \
        "A streamed answer."
    for response, left in ((plain, "4"), (streamed, "3")):
        assert response.headers["x-ratelimit-limit-requests"] == "60"
        assert response.headers["x-ratelimit-remaining-requests"] == left
        assert response.headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(response.headers["x-ratelimit-remaining-tokens"]) < 10_000
        assert response.headers["x-ratelimit-reset-requests"].endswith("s")
    assert streamed.headers["content-type"] == "text/event-stream"


def test_each_api_key_has_its_own_limits(llm):
    llm.respond = lambda request: text("ok")
    llm.rate_limit = RateLimit(rpm=60, burst_requests=1)
    ask_model(llm, "key-a")
    ask_model(llm, "key-b")
    with pytest.raises(openai.RateLimitError):
        ask_model(llm, "key-a")
    assert [(a.key, a.status) for a in llm.answers] == [("key-a", 200), ("key-b", 200), ("key-a", 429)]


def test_past_max_in_flight_requests_are_refused(llm):
    llm.respond = lambda request: text("ok")
    llm.latency, llm.max_in_flight = 1.0, 2
    threads = [threading.Thread(target=ask_model, args=(llm, key)) for key in ("key-a", "key-b")]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while llm.admitted < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as refused:  # a third, whichever its key
        ask_model(llm, "key-c")
    assert (refused.value.code, refused.value.response.headers["retry-after"]) == ("concurrency_limit_exceeded", "1")
    for thread in threads:
        thread.join()
    assert [(a.key, a.refused) for a in llm.answers if a.status == 429] == [("key-c", "concurrency")]
    assert llm.admitted == 0
    ask_model(llm)  # the slots are free again


def test_a_scripted_429_is_counted_and_the_project_header_names_the_client(llm):
    llm.respond = with_burst(lambda request: text("ok"), count=1, status=429, headers={"retry-after": "3"})
    with pytest.raises(openai.RateLimitError) as refused:
        openai.OpenAI(base_url=llm.url, api_key="k", project="cluster-a", max_retries=0).chat.completions.create(
            model="m", messages=ASK)
    assert refused.value.response.headers["retry-after"] == "3"
    assert llm.rate_limited == 1 and llm.answers[0].project == "cluster-a"


def test_setting_the_limits_again_fills_the_buckets():
    server = ScriptedLLM(lambda request: text("ok"), rate_limit=RateLimit(rpm=60, burst_requests=1)).start()
    try:
        ask_model(server)
        with pytest.raises(openai.RateLimitError):
            ask_model(server)
        server.rate_limit = RateLimit(rpm=60, burst_requests=1)
        ask_model(server)
        server.rate_limit = None
        for _ in range(3):
            ask_model(server)
        assert "x-ratelimit-limit-requests" not in ask_model(server).headers
    finally:
        server.stop()


@pytest.mark.parametrize(("seconds", "written"), [
    (0, "0s"), (0.02, "20ms"), (0.0201, "21ms"), (1, "1s"), (1.2, "1.2s"), (17.5184, "17.518s"),
    (60, "1m0s"), (86.4, "1m26.4s"), (360, "6m0s"), (3_600, "1h0m0s")])
def test_durations_are_written_as_openai_writes_them(seconds, written):
    assert duration(seconds) == written


def test_request_tokens_count_messages_tool_calls_and_tools():
    request = {"messages": [
        {"role": "system", "content": "s" * 40},
        {"role": "user", "content": [{"type": "text", "text": "u" * 40}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "abcd", "arguments": "a" * 36}}]},
        {"role": "tool", "tool_call_id": "c", "content": "t" * 40}],
        "tools": [{"type": "function", "function": {"name": "f"}}]}
    tools = len(json.dumps(request["tools"]))
    assert request_tokens(request) == -(-(160 + tools) // 4) + 1024
    assert request_tokens({**request, "max_tokens": 10}, 1024) == -(-(160 + tools) // 4) + 10
    assert request_tokens({**request, "max_completion_tokens": 7}) == -(-(160 + tools) // 4) + 7
