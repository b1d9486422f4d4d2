"""A provider's 429 through the real engine, the real openai SDK and the scripted server:
every worker holds until Retry-After, the call is asked again without spending one of
the role's retries, and the wait shows in the timeline and the waterfall."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from orchestration.llm.openai_provider import _Client
from orchestration.models import AgentDispatch, Event
from orchestration.reports.waterfall import turn_waterfall
from tests.support.llm_server import Agent, Plan, agent_of, text, with_burst

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = ("tasks.search", {"status": "open"})


@pytest.fixture
def no_retries(settings):
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "orchestrator_max_retries": 0, "agent_max_retries": 0}


def is_agent(request: dict, agent_id: str) -> bool:
    names = {tool["function"]["name"] for tool in request.get("tools", [])}
    return "use_skill" in names and agent_of(request) == agent_id


def is_orchestrator(request: dict) -> bool:
    return "use_skill" not in {tool["function"]["name"] for tool in request.get("tools", [])}


def test_an_agents_429_waits_for_retry_after_and_spends_no_retry(llm, run_turn, no_retries):
    plan = Plan([Agent("a", ["tasks.search"], [SEARCH])], answer="Done.")
    llm.respond = burst = with_burst(plan, count=1, status=429, headers={"retry-after": "1"},
                                     when=lambda r: is_agent(r, "a"))
    turn = run_turn()

    assert turn.status == "completed", turn.error
    assert burst.failed == 1
    agent = AgentDispatch.objects.get(turn=turn, agent_id="a")
    assert (agent.outcome, agent.retries, turn.llm_retries) == ("completed", 0, 0)
    assert not Event.objects.filter(turn=turn, type="agent.subagent_attempt").exists()
    wait = Event.objects.get(turn=turn, type="llm.waiting")
    assert wait.dispatch_id == agent.pk and wait.payload["waited_ms"] >= 500
    assert "rate limit" in wait.summary
    # its wall clock moved on by the wait
    timeout = timedelta(seconds=turn.limits["agent_timeout_seconds"])
    assert agent.deadline_at - agent.started_at >= timeout + timedelta(milliseconds=500)
    bars = [bar for row in turn_waterfall(turn).rows for bar in row.bars if bar.kind == "wait"]
    assert len(bars) == 1 and bars[0].duration_ms >= 500


def test_the_orchestrators_429_waits_too(llm, run_turn, no_retries):
    plan = Plan([Agent("a", ["tasks.search"], [SEARCH])], answer="Done.")
    llm.respond = with_burst(plan, count=1, status=429, headers={"retry-after-ms": "700"}, when=is_orchestrator)
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert turn.llm_retries == 0
    wait = Event.objects.get(turn=turn, type="llm.waiting")
    assert wait.dispatch_id is None and wait.payload["iteration"] == 1


def test_out_of_quota_is_not_waited_for(llm, run_turn, no_retries):
    """OpenAI answers an exhausted quota with a 429 too: no wait helps, the turn fails."""
    from tests.support.llm_server import Reply
    import json

    llm.respond = lambda request: Reply(status=429, body=json.dumps(
        {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                   "code": "insufficient_quota"}}))
    turn = run_turn()
    assert turn.status == "failed" and "quota" in turn.error
    assert len(llm.requests) == 1


def test_the_sdk_leaves_429s_to_the_limiter():
    client = _Client(api_key="x", base_url="http://127.0.0.1:9/v1")
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    assert not client._should_retry(httpx.Response(429, request=request))
    assert client._should_retry(httpx.Response(503, request=request))


def test_stop_while_the_orchestrator_waits_for_the_provider(llm, run_turn, no_retries):
    """A hold of a minute: the owner's Stop ends the wait within a second or two."""
    import asyncio
    import threading
    import time

    from django.db import connection

    from orchestration.delivery import runner
    from orchestration.lifecycle.turns import turn_stop
    from orchestration.llm import capacity
    from orchestration.models import Turn

    llm.respond = Plan([], answer="Never asked.")
    limiter = capacity.process_limiter(runner.db)
    endpoint = capacity.Endpoint.of(llm.url, "test-key")
    asyncio.run(limiter.hold(endpoint, "gpt-4o-mini", time.time() + 60))

    def stop_soon():
        time.sleep(1.0)
        try:
            turn = Turn.objects.select_related("conversation__owner").latest("id")
            turn_stop(turn=turn, user=turn.conversation.owner)
        finally:
            connection.close()

    stopper = threading.Thread(target=stop_soon)
    stopper.start()
    started = time.monotonic()
    turn = run_turn()
    stopper.join()
    assert time.monotonic() - started < 10
    turn.refresh_from_db()
    assert turn.status == "stopped"
    assert llm.requests == []


def test_a_streamed_answer_that_outlasts_its_slots_ttl_keeps_the_only_slot(llm, run_turn, settings):
    """With one call at a time, a slot lapses a moment after the call's timeout (3 s here),
    for a process that died holding it; but a stream's timeout is per chunk, and this
    answer streams for 4 s. Another process asking for the slot 3.5 s into the stream
    gets it only once the stream has ended (a lapsed slot let it out beside the stream)."""
    import asyncio
    import threading
    import time

    from django.db import connection

    from orchestration.delivery import runner
    from orchestration.llm import capacity
    from orchestration.llm.capacity.limiter import Limiter, Priority

    settings.ASSISTANT_PROVIDER_CONCURRENCY = 1
    settings.ASSISTANT_LLM_TIMEOUT_SECONDS = 1
    settings.ASSISTANT_LLM_MAX_RETRIES = 0  # the slot's time-to-live: 1 s and 2 s more
    llm.respond, llm.chunk_interval = lambda request: text("word" * 80), 0.05  # 80 chunks: 4 s
    other = Limiter(capacity.store_for_deployment(runner.db), concurrency=1, grant_ttl=3)
    admitted: list[float] = []

    def another_process():
        try:
            deadline = time.monotonic() + 10
            while not any(request.get("stream") for request in llm.requests) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(3.5)
            grant = asyncio.run(other.acquire(capacity.Endpoint.of(llm.url, "test-key"), "gpt-4o-mini", tokens=0,
                                              priority=Priority(orchestrator=False)))
            admitted.append(time.time())
            asyncio.run(grant.settle(0))
        finally:
            connection.close()

    asker = threading.Thread(target=another_process)
    asker.start()
    turn = run_turn()
    asker.join()
    assert turn.status == "completed", turn.error
    (stream,) = [answer for answer in llm.answers if llm.requests[answer.index].get("stream")]
    assert stream.answered - stream.arrived > 3.5
    assert admitted and admitted[0] >= stream.answered - 0.05, "another call was admitted beside the stream"
