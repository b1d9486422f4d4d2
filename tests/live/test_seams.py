"""Seams between the engine's paths (issue 25), through a real qcluster and the scripted
model server over HTTP.

- Pauses are not crashes: an agent paused twice by a turn limit and continued twice, then
  killed with its whole cluster during its last model call, is recovered once more by
  the reaper, not dead-lettered. Only real crashes (expired leases) count toward
  ASSISTANT_MAX_STEP_ATTEMPTS.
- Slow skills do not stall a process: eight agents inside a slow skill on one worker
  process do not delay another user's agent, which only talks to the model.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.contrib.auth import get_user_model

from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, Event, SkillExecution, TurnPause
from orchestration.questions.pauses import turn_continue
from orchestration.lifecycle.turns import turn_start
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.mail import sends_begun
from tests.live.test_faults import assert_settled, wait_turn_reaping
from tests.live.test_qcluster import EMAIL, SEARCH, is_agent, tool_results_in, turn_done
from tests.support.llm_server import Agent, Plan, agent_of, user_text

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SUCCEEDED = (DispatchState.COMPLETED, DispatchState.CLOSED)
DEAD_LETTER = "giving up"  # "The worker stopped 3 times; giving up (dead-lettered)."


def test_continues_then_killed_cluster_is_one_crash(llm, qcluster, alice, settings):
    """Three skill calls under a turn limit of one: the turn pauses twice ("continue?")
    and the owner continues twice, so the agent is delivered three times without a single
    crash. Then the whole cluster is SIGKILLed during the agent's last model call: one
    real crash. A fresh cluster and the reaper recover it, and it reports."""
    limits = {**settings.ASSISTANT_LIMITS, "turn_max_skill_calls": 1}
    settings.ASSISTANT_LIMITS = limits  # the turn's snapshot, and what Continue grants: one more call
    plan = Plan([Agent("worker", ["tasks.search"], [SEARCH, SEARCH, SEARCH], report="Three searches done.")],
                answer="All three searches done.", discover=False)
    last_call_hangs = threading.Event()

    def respond(request):
        reply = plan(request)
        # The agent's last model call (its three results in hand) hangs the first time:
        # the cluster is killed meanwhile. The call asked again after the crash answers.
        if is_agent(request, "worker") and tool_results_in(request) == 3 and not last_call_hangs.is_set():
            last_call_hangs.set()
            reply.delay = 20
        return reply

    llm.latency = 0.05
    llm.respond = respond
    cluster = qcluster(workers=2, env={"LIMIT_TURN_MAX_SKILL_CALLS": "1"})  # the lease: LEASE_SECONDS
    turn = turn_start(conversation=conversation_for(alice), text="Three searches, one call at a time")
    assert turn.limits["turn_max_skill_calls"] == 1

    for continued in range(2):
        def paused() -> bool:
            return turn_done(turn) and (turn.status != "paused"
                                        or TurnPause.objects.filter(turn=turn, decision="").exists())

        wait_for(paused, timeout=60, what=f"pause {continued + 1} (continue?)", cluster=cluster)
        assert turn.status == "paused", (turn.status, turn.error)
        pause = TurnPause.objects.get(turn=turn, decision="")
        assert pause.limit == "turn_max_skill_calls"
        turn_continue(turn=turn, user=alice)  # what the page's Continue button does

    wait_for(last_call_hangs.is_set, timeout=60, what="the agent's last model call", cluster=cluster)
    worker = AgentDispatch.objects.get(turn=turn, agent_id="worker")
    assert worker.state == DispatchState.RUNNING
    assert SkillExecution.objects.filter(dispatch=worker, status="completed").count() == 3
    os.killpg(cluster.pid, signal.SIGKILL)  # the whole cluster, mid model call
    cluster.stop()

    restarted = qcluster(workers=2)
    wait_turn_reaping(turn, restarted, timeout=60)  # the reaper every LEASE_SECONDS

    worker.refresh_from_db()
    assert DEAD_LETTER not in worker.error, f"one crash dead-lettered the agent: {worker.error!r}"
    assert worker.state in SUCCEEDED and worker.outcome == DispatchOutcome.COMPLETED, (
        worker.state, worker.outcome, worker.error)
    assert not Event.objects.filter(turn=turn, type="agent.subagent_failed").exists()
    assert turn.status == "completed", turn.error
    assert_settled(turn)
    assert "Three searches done." in worker.result
    # Each search ran once; the model was asked once per step, and the hung call again
    # after the crash (the replays answered from storage).
    assert SkillExecution.objects.filter(dispatch=worker).count() == 3
    assert sum(1 for r in llm.requests if is_agent(r, "worker")) == 5
    assert llm.errors == []


SLOW_SENDS = 8
SLOW_SECONDS = 8.0
LATENCY = 0.3
QUICK = "A quick question"


@pytest.mark.postgres  # eight writers at once: SQLite has one
@pytest.mark.serial  # it times one worker process to a few tenths of a second: not beside another test's load
def test_slow_skills_do_not_delay_another_agent(llm, qcluster, bob, tmp_path):
    """Eight users' agents are each inside a slow email.send (SLOW_SECONDS) on the one
    worker process; then bob's turn starts, whose agent only talks to the model. Its
    model requests (the scripted server's timeline) follow each other a model latency
    apart, and bob has his answer long before any slow send has finished.

    Eight users, one slow agent each, so that no per-user cap or egress limit is what
    holds anyone back. The eight sends must be in progress at once in that process."""
    mail_dir = tmp_path / "mail" / "sent"
    mail_dir.mkdir(parents=True)
    users = [get_user_model().objects.create_user(username=f"sender{i}", email=f"sender{i}@example.com")
             for i in range(SLOW_SENDS)]
    plans = {f"Mail Bob, sender {i}": Plan([Agent(f"slow{i}", ["email.send"], [EMAIL], report=f"slow{i} mailed")],
                                           answer=f"Sent, sender {i}.", discover=False)
             for i in range(SLOW_SENDS)}
    plans[QUICK] = Plan([Agent("quick", ["tasks.search"], [], report="Nothing to look up.")],
                        answer="Here is your answer.", discover=False)
    by_agent = {agent_id: plan for plan in plans.values() for agent_id in plan.agents}

    def respond(request):
        if "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}:
            return by_agent[agent_of(request)](request)
        asked = user_text(request)
        return next(plan for text, plan in plans.items() if text in asked)(request)

    llm.latency = LATENCY
    llm.respond = respond
    cluster = qcluster(workers=1, env={  # one process: one runner for all of it
        "EMAIL_BACKEND": "tests.live.mail.SlowFileBackend", "EMAIL_FILE_PATH": str(mail_dir),
        "SLOW_MAIL_SECONDS": str(SLOW_SECONDS),
        "ASSISTANT_RUNNER_SKILL_THREADS": str(SLOW_SENDS),  # room for all eight: the point is who waits
    })
    slow_turns = [turn_start(conversation=conversation_for(user), text=f"Mail Bob, sender {i}")
                  for i, user in enumerate(users)]

    wait_for(lambda: len(sends_begun(mail_dir)) >= SLOW_SENDS, timeout=60,
             what=f"{SLOW_SENDS} slow sends in progress at once", cluster=cluster)
    first_send_ends = sends_begun(mail_dir)[0] + SLOW_SECONDS
    started = time.time()
    assert first_send_ends - started > 4, "the slow sends began too far apart to leave bob a window"
    quick = turn_start(conversation=conversation_for(bob), text=QUICK)
    wait_for(lambda: turn_done(quick) or time.time() > first_send_ends + 5, timeout=60,
             what="bob's turn", cluster=cluster)
    answered = time.time()

    mine = sorted((arrived, done) for index, arrived, done in list(llm.timeline)
                  if _is_bobs(llm.requests[index]))
    when = [(round(arrived - started, 2), round(done - started, 2)) for arrived, done in mine]
    # Bob's turn: the orchestrator dispatches, asks for results, answers; the agent reports.
    assert len(mine) >= 4, f"bob's requests (arrived, answered), seconds after his turn began: {when}"
    assert mine[0][0] - started < 1.5, f"bob's first model request waited: {when}"
    gaps = [round(b[0] - a[0], 2) for a, b in zip(mine, mine[1:])]
    assert max(gaps) < LATENCY + 1.0, f"bob's model requests were held up: gaps {gaps}; {when}"
    assert mine[-1][1] < first_send_ends, f"bob waited for the slow sends: {when}, first send ends at " \
                                          f"{first_send_ends - started:.2f}"
    assert quick.status == "completed", quick.error
    assert answered - started < 4 * LATENCY + 3, f"bob's turn took {answered - started:.1f}s: {when}"

    # And the slow sends finish too, each once.
    for turn in slow_turns:
        wait_for(lambda: turn_done(turn), timeout=60, what=f"turn {turn.pk} to finish", cluster=cluster)
        assert turn.status == "completed", turn.error
    assert len(list(mail_dir.iterdir())) == SLOW_SENDS
    assert llm.errors == []


def _is_bobs(request: dict) -> bool:
    if "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}:
        return agent_of(request) == "quick"
    return QUICK in user_text(request)
