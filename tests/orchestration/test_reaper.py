"""The reaper's re-queue of work whose task was lost before any worker claimed it (a
cluster killed while holding tasks it had taken from the queue). The live version, with
a real qcluster SIGKILLed, is tests/live/test_faults.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orchestration.models import AgentDispatch, DispatchState, TurnStatus
from orchestration.reaper import reap_expired
from orchestration.engine.agent import Agent
from orchestration.tasks import enqueue_subagent
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(monkeypatch) -> list[tuple[str, tuple]]:
    sent: list[tuple[str, tuple]] = []
    monkeypatch.setattr("orchestration.tasks.async_task", lambda func, *args: sent.append((func, args)))
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
    assert queue == [("orchestration.tasks.subagent_run", (lost.pk,))]
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
