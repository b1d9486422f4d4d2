"""The reaper's re-queue of work whose task was lost before any worker claimed it (a
cluster killed while holding tasks it had taken from the queue). The live version, with
a real qcluster SIGKILLed, is tests/live/test_faults.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orchestration.models import AgentDispatch, DispatchState, TurnStatus
from orchestration.lifecycle.reaper import reap_expired
from orchestration.engine.agent import Agent
from orchestration.delivery.queue import enqueue_subagent
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(monkeypatch) -> list[tuple[str, tuple]]:
    sent: list[tuple[str, tuple]] = []
    monkeypatch.setattr("orchestration.delivery.queue.async_task", lambda func, *args: sent.append((func, args)))
    return sent


def _ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def test_work_unclaimed_for_longer_than_a_lease_is_queued_again_once(
        alice, queue, settings, django_capture_on_commit_callbacks):
    settings.ASSISTANT_LEASE_SECONDS = 60
    turn = turn_for(conversation_for(alice), status=TurnStatus.WAITING,
                    awaiting={"agent_ids": ["lost", "fresh", "never-queued", "running"]})
    lost = dispatch_for(turn, "lost", queued_at=_ago(61))
    dispatch_for(turn, "fresh", queued_at=_ago(5))  # its task is probably still in the queue
    dispatch_for(turn, "never-queued", depends_on=["running"])  # waits for its dependency: nobody queued it
    dispatch_for(turn, "running", state=DispatchState.RUNNING, lease_expires_at=timezone.now() + timedelta(minutes=1))

    with django_capture_on_commit_callbacks(execute=True):
        counts = reap_expired()

    assert counts["queued_again"] == 1
    assert queue == [("orchestration.worker.tasks.subagent_run", (lost.pk,))]
    lost.refresh_from_db()
    assert lost.queued_at > _ago(5)  # stamped again: not re-queued on every pass
    with django_capture_on_commit_callbacks(execute=True):
        assert reap_expired()["queued_again"] == 0


def test_a_turn_that_is_over_needs_none_of_its_queued_work(
        alice, queue, settings, django_capture_on_commit_callbacks):
    settings.ASSISTANT_LEASE_SECONDS = 60
    turn = turn_for(conversation_for(alice), status=TurnStatus.STOPPED)
    dispatch_for(turn, "left", queued_at=_ago(120))
    with django_capture_on_commit_callbacks(execute=True):
        assert reap_expired()["queued_again"] == 0
    assert queue == []


def test_enqueue_stamps_and_the_claim_clears(alice, queue, django_capture_on_commit_callbacks):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    dispatch = dispatch_for(turn, "a1")
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_subagent(dispatch.pk)
    assert AgentDispatch.objects.get(pk=dispatch.pk).queued_at is not None
    assert Agent.claim(dispatch.pk)
    assert AgentDispatch.objects.get(pk=dispatch.pk).queued_at is None


def _expire(dispatch_or_turn) -> None:
    type(dispatch_or_turn).objects.filter(pk=dispatch_or_turn.pk).update(lease_expires_at=_ago(1))


def test_pauses_continues_and_hand_backs_count_no_crash(alice, queue, settings, django_capture_on_commit_callbacks):
    """A dispatch given back five times (pauses, Continues, a process ending) has crashed
    none of them: the allowance is for workers that die."""
    from orchestration.lifecycle import dispatches as lifecycle

    settings.ASSISTANT_MAX_STEP_ATTEMPTS = 3
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING, lease_token="orchestrator",
                    lease_expires_at=timezone.now() + timedelta(minutes=1))
    dispatch = dispatch_for(turn, "a1", skills=["tasks.create"])
    for _ in range(5):
        agent = Agent.claim(dispatch.pk)
        assert agent is not None
        assert lifecycle.agent_give_back(dispatch.pk, agent.token)
    with django_capture_on_commit_callbacks(execute=True):
        assert reap_expired()["crashes"] == 0
    assert AgentDispatch.objects.get(pk=dispatch.pk).crashes == 0


def test_an_expired_lease_is_a_crash_and_the_last_one_dead_letters(alice, queue, settings,
                                                                  django_capture_on_commit_callbacks):
    settings.ASSISTANT_MAX_STEP_ATTEMPTS = 3
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING, lease_token="orchestrator",
                    lease_expires_at=timezone.now() + timedelta(minutes=1))
    dispatch = dispatch_for(turn, "a1", skills=["tasks.create"])
    for crash in (1, 2):
        assert Agent.claim(dispatch.pk) is not None
        _expire(dispatch)  # the worker died holding it
        with django_capture_on_commit_callbacks(execute=True):
            counts = reap_expired()
        dispatch.refresh_from_db()
        assert (counts["crashes"], dispatch.crashes, dispatch.state) == (1, crash, DispatchState.CREATED)
        assert dispatch.queued_at is not None  # runnable again, and queued
    assert Agent.claim(dispatch.pk) is not None
    _expire(dispatch)
    with django_capture_on_commit_callbacks(execute=True):
        assert reap_expired()["dispatches_dead"] == 1
    dispatch.refresh_from_db()
    assert dispatch.crashes == 3 and dispatch.outcome == "failed"
    assert "stopped 3 times" in dispatch.error


def test_an_orchestrator_whose_worker_died_is_queued_again_and_counted(alice, queue, settings,
                                                                      django_capture_on_commit_callbacks):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING, lease_token="dead",
                    lease_expires_at=_ago(1))
    with django_capture_on_commit_callbacks(execute=True):
        assert reap_expired()["crashes"] == 1
    turn.refresh_from_db()
    assert (turn.crashes, turn.lease_token) == (1, "")
    assert ("orchestration.worker.tasks.orchestrator_step", (turn.pk,)) in queue


def test_a_runnable_agent_nobody_queued_is_found(alice, queue, django_capture_on_commit_callbacks):
    """Whatever interleaving left an agent created and unqueued in a running turn (the
    release window of old), the one rule queues it."""
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING, lease_token="orchestrator",
                    lease_expires_at=timezone.now() + timedelta(minutes=1))
    stranded = dispatch_for(turn, "stranded", skills=["tasks.create"])
    with django_capture_on_commit_callbacks(execute=True):
        assert reap_expired()["queued_again"] == 1
    assert queue == [("orchestration.worker.tasks.subagent_run", (stranded.pk,))]
