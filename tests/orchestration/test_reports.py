"""An agent's report is stored with its end (issue 27): the answer, the agent's move, both
events, the turn's tokens and the schedule rule in one transaction, so a crash cannot
fall between them and the dependents (or the waiting orchestrator) are queued by the
commit that stored it. What a report found too late (a pause, a Stop) is as before: the
answer is kept and paid for, and the agent is not ended by it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestration.engine import steps
from orchestration.engine.agent import Agent
from orchestration.llm import LLMResponse, Usage
from orchestration.models import AgentDispatch, DispatchState, Event, LLMCall, Turn, TurnStatus
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)

REPORT = LLMResponse(content="a found three", usage=Usage(prompt_tokens=100, completion_tokens=20))


def claimed(turn: Turn, agent_id: str, **fields) -> Agent:
    agent = Agent.claim(dispatch_for(turn, agent_id, skills=["tasks.search"], **fields).pk)
    agent.load()
    agent.counted = True  # as the step before its call leaves it
    return agent


def test_a_report_ends_the_agent_and_wakes_the_waiting_orchestrator_in_one_commit(alice):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    agent = claimed(turn, "a")
    Turn.objects.filter(pk=turn.pk).update(status=TurnStatus.WAITING, awaiting={"agent_ids": ["a"]})

    with CaptureQueriesContext(connection) as queries:
        assert agent.store(0, REPORT, duration_ms=300) is None
    commits = [q for q in queries.captured_queries if q["sql"].startswith("COMMIT")]
    turn_updates = [q for q in queries.captured_queries if q["sql"].startswith('UPDATE "orchestration_turn"')]

    dispatch = AgentDispatch.objects.get(pk=agent.dispatch.pk)
    assert dispatch.state == DispatchState.WAITING_FOR_MERGE and dispatch.result == "a found three"
    assert dispatch.transcript[-1] == {"role": "assistant", "content": "a found three"}
    assert (dispatch.llm_calls, dispatch.prompt_tokens, dispatch.completion_tokens) == (1, 100, 20)
    turn.refresh_from_db()
    assert turn.status == TurnStatus.RUNNING and turn.queued_at is not None  # woken, and queued
    assert (turn.prompt_tokens, turn.completion_tokens) == (100, 20)
    types = list(Event.objects.filter(dispatch=dispatch).order_by("id").values_list("type", flat=True))
    assert types[-2:] == ["agent.llm_call", "agent.subagent_waiting_for_merge"]
    assert len(commits) <= 1 and len(turn_updates) == 2, queries.captured_queries  # tokens; woken and queued

    # The loop then finds the agent done, and its end already written.
    assert agent.act(0, REPORT).kind is steps.Kind.DONE
    with CaptureQueriesContext(connection) as queries:
        agent.end(steps.done("completed", "a found three"))
    assert not queries.captured_queries


def test_an_end_reads_only_what_the_schedule_needs_of_the_other_agents(alice):
    """The schedule rule reads every agent of the turn at every end: not their runs
    (transcripts, reports), which grow with the work and were most of an end's CPU."""
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    long_run = [{"role": "tool", "content": "x" * 5000}] * 20
    for name in ("b", "c"):
        dispatch_for(turn, name, skills=["tasks.search"], depends_on=["a"], transcript=long_run,
                     context="y" * 5000)
    agent = claimed(turn, "a")

    with CaptureQueriesContext(connection) as queries:
        assert agent.store(0, REPORT, duration_ms=300) is None
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")
             and 'FROM "orchestration_agentdispatch"' in q["sql"]]
    assert reads and not [sql for sql in reads if '"transcript"' in sql or '"context"' in sql], reads
    queued = AgentDispatch.objects.filter(turn=turn, agent_id__in=["b", "c"]).values_list("queued_at", flat=True)
    assert len(queued) == 2 and None not in queued  # the end queued both


@pytest.mark.parametrize("status, then", [(TurnStatus.PAUSED, steps.Kind.PAUSE), (TurnStatus.STOPPED, steps.Kind.STOP)])
def test_a_report_too_late_is_kept_and_ends_nothing(alice, status, then):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    agent = claimed(turn, "a")
    Turn.objects.filter(pk=turn.pk).update(status=status)

    assert agent.store(0, REPORT, duration_ms=300).kind is then

    dispatch = AgentDispatch.objects.get(pk=agent.dispatch.pk)
    assert dispatch.state == DispatchState.RUNNING and not agent.ended  # a resume replays the stored report
    assert LLMCall.objects.filter(dispatch=dispatch).count() == 1
    assert not Event.objects.filter(dispatch=dispatch, type="agent.subagent_waiting_for_merge").exists()
    step = Event.objects.get(dispatch=dispatch, type="agent.llm_call")
    assert ("too late" in step.summary) is (then is steps.Kind.STOP)
