"""The seams between the engine's paths (issue 25), each forced in the order that broke.

A Continue that commits between an agent noticing its turn paused and the agent letting
go used to leave it `created`, unqueued, and the turn waiting for good: the give-back
now happens under the turn's lock and ends with the schedule rule, so whichever commits
first, the agent is queued once the turn runs again. The orchestrator likewise.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from orchestration.lifecycle import dispatches as lifecycle
from orchestration.budgets.limits import LimitTripped
from orchestration.engine import steps
from orchestration.engine.agent import Agent
from orchestration.engine.orchestrator import Orchestrator
from orchestration.models import AgentDispatch, DispatchState, Turn, TurnStatus
from orchestration.questions.pauses import turn_continue, turn_pause
from orchestration.lifecycle.reaper import reap_expired
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)


def trip() -> LimitTripped:
    return LimitTripped("turn_max_skill_calls", "This turn used its 1 skill calls.", detail={"limit": 1, "used": 1})


@pytest.fixture
def running_agent(alice, queued):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    dispatch = dispatch_for(turn, "worker", skills=["tasks.create"])
    agent = Agent.claim(dispatch.pk)
    assert agent is not None
    agent.load()
    return turn, agent


def test_a_continue_in_the_release_window_queues_the_agent(running_agent, alice, queued):
    turn, agent = running_agent
    turn_pause(turn_id=turn.pk, trip=trip())  # another agent tripped the limit
    noticed = agent.check()
    assert noticed.kind is steps.Kind.PAUSE  # the agent sees the pause; before it lets go...
    turn_continue(turn=Turn.objects.get(pk=turn.pk), user=alice)  # ...the owner's Continue commits
    assert AgentDispatch.objects.get(pk=agent.dispatch.pk).state == DispatchState.RUNNING
    queued.tasks.clear()

    agent.end(noticed)  # and now it lets go

    dispatch = AgentDispatch.objects.get(pk=agent.dispatch.pk)
    assert dispatch.state == DispatchState.CREATED and dispatch.queued_at is not None
    assert ("orchestration.worker.tasks.subagent_run", (dispatch.pk,)) in queued.tasks
    assert dispatch.crashes == 0


def test_a_continue_after_the_release_queues_the_agent(running_agent, alice, queued):
    turn, agent = running_agent
    turn_pause(turn_id=turn.pk, trip=trip())
    agent.end(agent.check())  # lets go while the turn is paused: held, not queued
    dispatch = AgentDispatch.objects.get(pk=agent.dispatch.pk)
    assert dispatch.state == DispatchState.CREATED and dispatch.queued_at is None
    queued.tasks.clear()

    turn_continue(turn=Turn.objects.get(pk=turn.pk), user=alice)

    assert ("orchestration.worker.tasks.subagent_run", (dispatch.pk,)) in queued.tasks


def test_an_agent_that_trips_the_limit_pauses_and_lets_go_at_once(running_agent, alice, queued):
    turn, agent = running_agent
    agent.end(steps.pause(trip()))
    turn.refresh_from_db()
    dispatch = AgentDispatch.objects.get(pk=agent.dispatch.pk)
    assert turn.status == TurnStatus.PAUSED and dispatch.state == DispatchState.CREATED
    pause = turn.pauses.get()
    assert pause.detail["not_started"] == ["worker"] and pause.detail["running"] == []
    queued.tasks.clear()
    turn_continue(turn=turn, user=alice)
    assert ("orchestration.worker.tasks.subagent_run", (dispatch.pk,)) in queued.tasks


def test_a_delivery_its_paused_turn_refuses_leaves_the_agent_to_the_continue(alice, queued):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    dispatch = dispatch_for(turn, "worker", skills=["tasks.create"])
    with transaction.atomic():
        lifecycle.dispatch_schedule(lifecycle.lock_turn(turn.pk))  # queued: stamped
    turn_pause(turn_id=turn.pk, trip=trip())
    assert Agent.claim(dispatch.pk) is None  # the task arrives while the turn is paused
    queued.tasks.clear()
    turn_continue(turn=Turn.objects.get(pk=turn.pk), user=alice)
    assert ("orchestration.worker.tasks.subagent_run", (dispatch.pk,)) in queued.tasks


def test_the_orchestrator_paused_by_an_agent_keeps_its_call_and_goes_on_after_a_continue(alice, queued):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    orchestrator = Orchestrator.claim(turn.pk)
    orchestrator.load()
    turn_pause(turn_id=turn.pk, trip=trip())  # an agent trips a limit during its model call
    assert Turn.objects.get(pk=turn.pk).lease_token == orchestrator.token  # kept: its answer is paid for
    noticed = orchestrator.check()
    assert noticed.kind is steps.Kind.PAUSE
    turn_continue(turn=Turn.objects.get(pk=turn.pk), user=alice)  # before it lets go
    queued.tasks.clear()

    orchestrator.end(noticed)

    turn.refresh_from_db()
    assert turn.status == TurnStatus.RUNNING and turn.lease_token == ""
    assert ("orchestration.worker.tasks.orchestrator_step", (turn.pk,)) in queued.tasks


def test_nothing_is_left_for_the_reaper(running_agent, alice, queued):
    turn, agent = running_agent
    turn_pause(turn_id=turn.pk, trip=trip())
    noticed = agent.check()
    turn_continue(turn=Turn.objects.get(pk=turn.pk), user=alice)
    agent.end(noticed)
    counts = reap_expired()
    assert counts["queued_again"] == 0 and counts["crashes"] == 0
