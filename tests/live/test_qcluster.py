"""The engine in a real `qcluster` process: parallel workers, a SIGKILLed worker, a race.

Nothing runs inline here: the test process starts the turn and polls the database while
the cluster's workers (separate processes) run the orchestrator and the sub-agents
against the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from orchestration.models import AgentDispatch, Event, SkillExecution, Turn, TurnPause
from orchestration.lifecycle.reaper import reap_expired
from orchestration.lifecycle.turns import turn_start
from skills.domains.email.models import OutboxEmail
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.support.llm_server import Agent, Plan, agent_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEARCH = ("tasks.search", {"status": "open"})
EMAIL = ("email.send", {"to": ["bob@example.com"], "subject": "Diamond report", "body": "Hello Bob"})
DONE = ("completed", "failed", "paused", "stopped")


def is_agent(request: dict, agent_id: str) -> bool:
    names = {tool["function"]["name"] for tool in request.get("tools", [])}
    return "use_skill" in names and agent_of(request) == agent_id


def tool_results_in(request: dict) -> int:
    return sum(1 for m in request["messages"] if m["role"] == "tool")


def turn_done(turn: Turn) -> bool:
    turn.refresh_from_db()
    return turn.status in DONE


def wait_turn(turn: Turn, cluster, *, timeout: float = 90) -> Turn:
    wait_for(lambda: turn_done(turn), timeout=timeout, what=f"turn {turn.pk} to finish", cluster=cluster)
    return turn


def test_parallel_agents_overlap(llm, qcluster, alice):
    llm.latency = 0.3
    llm.respond = Plan([Agent(f"p{i}", ["tasks.search"], [SEARCH]) for i in range(4)], answer="Fan-out done.")
    cluster = qcluster(workers=5)  # the orchestrator's step holds one until it waits

    turn = turn_start(conversation=conversation_for(alice), text="Search four ways at once")
    wait_turn(turn, cluster)

    assert turn.status == "completed", turn.error
    assert llm.errors == []
    agents = list(AgentDispatch.objects.filter(turn=turn))
    assert len(agents) == 4
    assert {(a.state, a.outcome) for a in agents} == {("closed", "completed")}
    assert SkillExecution.objects.filter(dispatch__turn=turn, status="completed").count() == 4
    # Each agent makes two scripted LLM calls of 0.3 s; all four ran at the same time.
    latest_start = max(a.started_at for a in agents)
    earliest_finish = min(a.finished_at for a in agents)
    assert latest_start < earliest_finish, [(a.agent_id, a.started_at, a.finished_at) for a in agents]
    span = (max(a.finished_at for a in agents) - min(a.started_at for a in agents)).total_seconds()
    busy = sum((a.finished_at - a.started_at).total_seconds() for a in agents)
    assert busy / span > 2, f"agents ran {busy:.2f}s in total within {span:.2f}s"


def test_diamond_survives_sigkill_mid_agent(llm, qcluster, alice, tmp_path):
    mail_dir = tmp_path / "mail"
    mail_dir.mkdir()
    plan = Plan([
        Agent("a", ["tasks.search"], [SEARCH]),
        Agent("b", ["tasks.search"], [SEARCH]),
        Agent("c", ["email.send"], [EMAIL], depends_on=["a", "b"], report="c mailed Bob"),
        Agent("d", ["tasks.search"], [SEARCH], depends_on=["c"]),
    ], answer="Diamond done.")
    c_in_slow_call = threading.Event()
    caller: dict = {}

    def respond(request):
        reply = plan(request)
        # c's second call (after email.send ran) answers slowly the first time: the
        # worker waiting for it is killed meanwhile. The replay gets a prompt answer.
        if is_agent(request, "c") and tool_results_in(request) == 1 and not c_in_slow_call.is_set():
            caller["address"] = llm.client
            c_in_slow_call.set()
            reply.delay = 30
        return reply

    llm.latency = 0.1
    llm.respond = respond
    cluster = qcluster(workers=4, env={
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(mail_dir),
    })
    turn = turn_start(conversation=conversation_for(alice), text="Diamond with an email")

    wait_for(lambda: c_in_slow_call.is_set() or turn_done(turn), timeout=60,
             what="c to reach its slow call", cluster=cluster)
    assert c_in_slow_call.is_set(), f"turn {turn.status} early: {turn.error}\n{cluster.log_tail()}"
    server_port = int(llm.url.rsplit(":", 1)[1].split("/")[0])
    worker = wait_for(lambda: cluster.pid_of_connection(caller["address"][1], server_port),
                      timeout=5, what="the worker running c", cluster=cluster)
    assert worker in cluster.descendants()
    assert worker not in (cluster.pid, os.getpid())
    c = AgentDispatch.objects.get(turn=turn, agent_id="c")
    assert c.state == "running" and c.crashes == 0
    assert len(os.listdir(mail_dir)) == 1  # the email went out before the kill
    os.kill(worker, signal.SIGKILL)

    # The sentinel replaces the dead worker; the engine recovers c once its lease expires.
    wait_for(lambda: "reincarnated worker" in cluster.log(), timeout=10,
             what="the sentinel to replace the killed worker", cluster=cluster)
    c.refresh_from_db()
    assert c.state == "running"  # nobody noticed yet: the task died with the worker
    time.sleep(max(0.0, (c.lease_expires_at - timezone.now()).total_seconds()) + 0.2)
    reap_expired()  # what django-q2's schedule runs every minute
    wait_turn(turn, cluster)

    assert turn.status == "completed", turn.error
    assert llm.errors == []
    dispatches = {d.agent_id: d for d in AgentDispatch.objects.filter(turn=turn)}
    assert {(d.state, d.outcome) for d in dispatches.values()} == {("closed", "completed")}
    assert not AgentDispatch.objects.filter(state="running").exists()
    c = dispatches["c"]
    assert c.crashes == 1
    assert dispatches["d"].started_at >= c.finished_at
    # The email ran once: the replay returned the stored result of the same tool call.
    assert len(os.listdir(mail_dir)) == 1
    assert OutboxEmail.objects.count() == 1
    assert SkillExecution.objects.filter(dispatch=c, skill="email.send").count() == 1
    attempts = Event.objects.filter(dispatch=c, type="agent.subagent_attempt")
    assert [e.payload.get("reason") for e in attempts] == ["redelivered"]
    c_events = Event.objects.filter(dispatch=c, type__startswith="agent.subagent_").order_by("id")
    c_types = list(c_events.values_list("type", flat=True))
    assert c_types == ["agent.subagent_created", "agent.subagent_started", "agent.subagent_attempt",
                       "agent.subagent_waiting_for_merge", "agent.subagent_closed"]
    # c asked the model three times: the call answered in full, the call lost with the
    # worker, and that call again after the replay (its first response came from storage).
    assert sum(1 for r in llm.requests if is_agent(r, "c")) == 3


def test_turn_skill_call_limit_race(llm, qcluster, alice, settings):
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_skill_calls": 3}
    llm.latency = 0.2
    llm.respond = Plan([Agent(f"r{i}", ["tasks.search"], [SEARCH]) for i in range(8)])
    cluster = qcluster(workers=8, env={"LIMIT_TURN_MAX_SKILL_CALLS": "3"})

    turn = turn_start(conversation=conversation_for(alice), text="Eight agents, three skill calls")
    assert turn.limits["turn_max_skill_calls"] == 3

    def quiet():
        turn.refresh_from_db()
        return (turn.status in DONE and not OrmQ.objects.exists()
                and not AgentDispatch.objects.filter(turn=turn, state="running").exists())

    wait_for(quiet, timeout=90, what=f"turn {turn.pk} to pause and the workers to go idle", cluster=cluster)

    assert turn.status == "paused", turn.error
    assert llm.errors == []
    assert turn.skill_calls == 3
    completed = SkillExecution.objects.filter(dispatch__turn=turn, status="completed")
    assert completed.count() == completed.values("dispatch").distinct().count() == 3
    assert SkillExecution.objects.filter(dispatch__turn=turn).exclude(status="completed").count() == 0
    assert Event.objects.filter(turn=turn, type="skill.started").count() == 3
    [pause] = TurnPause.objects.filter(turn=turn)
    assert pause.limit == "turn_max_skill_calls" and pause.decision == ""
    assert pause.detail["budget_left"]["skill_calls"] == 0
    assert Event.objects.filter(turn=turn, type="limit.tripped").count() == 1
    dispatches = AgentDispatch.objects.filter(turn=turn)
    assert dispatches.count() == 8
    failed = [(d.agent_id, d.error) for d in dispatches if d.outcome == "failed"]
    assert failed == []
