"""Seams between the engine's paths (issue 25), through a real qcluster and the scripted
model server over HTTP.

- Pauses are not crashes: an agent paused twice by a turn limit and continued twice, then
  killed with its whole cluster during its last model call, is recovered once more by
  the reaper, not dead-lettered. Only real crashes (expired leases) count toward
  ASSISTANT_MAX_STEP_ATTEMPTS.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from benchmarks.llm_server import Agent, Plan
from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, Event, SkillExecution, TurnPause
from orchestration.pauses import turn_continue
from orchestration.turns import turn_start
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.test_faults import assert_settled, wait_turn_reaping
from tests.live.test_qcluster import SEARCH, is_agent, tool_results_in, turn_done

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
