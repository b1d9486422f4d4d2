"""The engine's promises through a real qcluster, with a provider that behaves like real
ones (issue 13): fresh random tool-call ids (or `call_0` reused), 5xx bursts longer than
the SDK's own retries, and a worker SIGKILLed in the middle of a model call.

- an agent that sent an email, then hits a burst of 5xx, finishes with the email sent
  once, whatever ids the provider hands out;
- a batch with two cycles and dependents of both ends the turn;
- an agent's token budget and wall clock hold across a retry and a redelivery.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from django.utils import timezone

from orchestration.models import AgentDispatch, LLMCall, SkillExecution
from orchestration.lifecycle.reaper import reap_expired
from orchestration.lifecycle.turns import turn_start
from skills.domains.email.models import OutboxEmail
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.test_faults import assert_settled, mail_env, wait_turn_reaping
from tests.live.test_qcluster import EMAIL, SEARCH, is_agent, tool_results_in
from tests.support.llm_server import Agent, Plan, calls, text, with_burst

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The SDK retries once (the cluster's engine waits 0.1 s before its own retries).
RETRYING = {"ASSISTANT_LLM_MAX_RETRIES": "1"}


@pytest.fixture
def limits(settings):
    """`limits(agent_token_budget=350)`: for the turn's snapshot, taken in this process by
    turn_start; returns the same as the cluster's environment."""

    def set_limits(**values) -> dict[str, str]:
        settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, **values}
        return {f"LIMIT_{name.upper()}": str(value) for name, value in values.items()}

    return set_limits


@pytest.fixture
def mail(tmp_path) -> Path:
    directory = tmp_path / "mail" / "sent"
    directory.mkdir(parents=True)
    return directory


@pytest.mark.parametrize("ids", ["fresh", "reused"])
def test_an_email_then_a_5xx_burst_sends_the_email_once(llm, qcluster, alice, mail, limits, ids):
    llm.ids = ids
    plan = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed Bob."),
                 Agent("reader", ["tasks.search"], [SEARCH])], answer="Mail sent.")
    # Three 503s after the email: the SDK's try and retry, then the engine's first retry
    # (and the SDK's retry within it); the next one answers.
    llm.respond = burst = with_burst(plan, count=3, status=503, headers={"retry-after-ms": "20"},
                                     when=lambda r: is_agent(r, "mailer") and tool_results_in(r) == 1)
    cluster = qcluster(workers=3, env={**mail_env(mail), **RETRYING, **limits(agent_max_retries=2)})
    turn = turn_start(conversation=conversation_for(alice), text="Mail Bob")
    wait_turn_reaping(turn, cluster)

    assert_settled(turn, mail)
    assert turn.status == "completed", turn.error
    assert burst.failed == 3
    mailer = AgentDispatch.objects.get(turn=turn, agent_id="mailer")
    assert (mailer.outcome, mailer.retries, mailer.crashes) == ("completed", 1, 0)
    assert len(list(mail.iterdir())) == 1 and OutboxEmail.objects.count() == 1
    assert SkillExecution.objects.filter(dispatch=mailer).count() == 1
    asked = [r for r in llm.requests if is_agent(r, "mailer")]
    assert [tool_results_in(r) for r in asked] == [0, 1, 1, 1, 1]
    assert all(r["messages"] == asked[1]["messages"] for r in asked[2:])  # the transcript as it stood
    assert llm.errors == []


def test_a_batch_with_two_cycles_and_their_dependents_ends_the_turn(llm, qcluster, alice):
    def spec(agent_id, *depends_on):
        return {"agent_id": agent_id, "mission": f"mission:{agent_id}", "skills": ["tasks.search"],
                "depends_on": list(depends_on)}

    batch = [spec("a", "b"), spec("b", "a"), spec("c", "d"), spec("d", "c"),
             spec("after-a", "a"), spec("after-c", "c"), spec("free")]

    def respond(request):
        if "use_skill" in {t["function"]["name"] for t in request.get("tools", [])}:
            return text("free searched")
        sent = sum(1 for m in request["messages"] if m["role"] == "assistant")
        return [calls(*[("dispatch_agent", s) for s in batch]), calls(("get_agent_results", {})),
                text("Only free could run.")][min(sent, 2)]

    llm.respond = respond
    cluster = qcluster(workers=2)
    turn = turn_start(conversation=conversation_for(alice), text="A tangled plan")
    wait_turn_reaping(turn, cluster, timeout=60)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert list(AgentDispatch.objects.filter(turn=turn).values_list("agent_id", "state", "outcome")) == [
        ("free", "closed", "completed")]
    refusals = turn.messages.filter(role="tool", content__contains='"error"').values_list("content", flat=True)
    assert sum("cycle" in r for r in refusals) == 4 and sum("refused in this batch" in r for r in refusals) == 2
    assert llm.errors == []


def kill_worker_asking(llm, cluster, asked: threading.Event, caller: dict) -> None:
    """SIGKILL the cluster worker whose model call is being held (see `holding`)."""
    wait_for(asked.is_set, timeout=60, what="the call to hold", cluster=cluster)
    server_port = int(llm.url.rsplit(":", 1)[1].split("/")[0])
    worker = wait_for(lambda: cluster.pid_of_connection(caller["address"][1], server_port),
                      timeout=5, what="the worker asking", cluster=cluster)
    assert worker in cluster.descendants() and worker != cluster.pid
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: "reincarnated worker" in cluster.log(), timeout=10,
             what="the sentinel to replace the killed worker", cluster=cluster)


def holding(llm, plan, *, when, caller: dict, asked: threading.Event):
    """`plan`, except that the first request for which `when` holds hangs (its worker is
    killed meanwhile); later ones are answered."""

    def respond(request):
        reply = plan(request)
        if when(request) and not asked.is_set():
            caller["address"] = llm.client
            asked.set()
            reply.delay = 60
        return reply

    return respond


def redeliver(agent: AgentDispatch) -> None:
    """What the reaper's schedule does once the dead worker's lease expires."""
    agent.refresh_from_db()
    time.sleep(max(0.0, (agent.lease_expires_at - timezone.now()).total_seconds()) + 0.2)
    reap_expired()


def test_the_token_budget_holds_across_a_retry_and_a_redelivery(llm, qcluster, alice, limits):
    """120 tokens a response, a budget of 350: three model calls in all. The second
    call fails past the SDK's retries (an engine retry); the third is lost with its
    worker (a redelivery, which replays the first two from storage)."""
    plan = Plan([Agent("reader", ["tasks.search"], [SEARCH] * 6, extra={"max_tool_calls": 10})])
    asked, caller = threading.Event(), {}
    flaky = with_burst(plan, count=2, when=lambda r: is_agent(r, "reader") and tool_results_in(r) == 1)
    llm.respond = holding(llm, flaky, when=lambda r: is_agent(r, "reader") and tool_results_in(r) == 2,
                          caller=caller, asked=asked)
    cluster = qcluster(workers=2, env={**RETRYING, **limits(agent_token_budget=350)})
    turn = turn_start(conversation=conversation_for(alice), text="Search a lot")

    kill_worker_asking(llm, cluster, asked, caller)
    reader = AgentDispatch.objects.get(turn=turn, agent_id="reader")
    assert (reader.state, reader.retries) == ("running", 1)
    assert LLMCall.objects.filter(dispatch=reader).count() == 2  # stored; its row's counts come at its end
    redeliver(reader)
    wait_turn_reaping(turn, cluster)

    assert_settled(turn)
    reader.refresh_from_db()
    assert reader.outcome == "budget_exceeded" and "token budget of 350 spent" in reader.result
    assert (reader.crashes, reader.retries, reader.tool_calls_used) == (1, 1, 3)
    assert LLMCall.objects.filter(dispatch=reader).count() == 3
    assert reader.prompt_tokens + reader.completion_tokens == 360
    assert SkillExecution.objects.filter(dispatch=reader).count() == 3
    assert llm.errors == []


def test_the_wall_clock_holds_across_a_redelivery(llm, qcluster, alice, limits):
    """A 4 s limit from the first start: the worker dies in the agent's second model
    call, and the lease (5 s) outlasts the limit, so the redelivered agent times out at
    once instead of asking the model again."""
    plan = Plan([Agent("slow", ["tasks.search"], [SEARCH, SEARCH])])
    asked, caller = threading.Event(), {}
    llm.respond = holding(llm, plan, when=lambda r: is_agent(r, "slow") and tool_results_in(r) == 1,
                          caller=caller, asked=asked)
    cluster = qcluster(workers=2, env=limits(agent_timeout_seconds=4))
    turn = turn_start(conversation=conversation_for(alice), text="Take your time")

    kill_worker_asking(llm, cluster, asked, caller)
    slow = AgentDispatch.objects.get(turn=turn, agent_id="slow")
    redeliver(slow)
    wait_turn_reaping(turn, cluster)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    slow.refresh_from_db()
    assert slow.outcome == "timeout" and "wall-clock limit of 4s" in slow.error
    assert slow.crashes == 1
    assert [tool_results_in(r) for r in llm.requests if is_agent(r, "slow")] == [0, 1]  # none after the kill
    assert SkillExecution.objects.filter(dispatch=slow).count() == 1
    assert llm.errors == []
