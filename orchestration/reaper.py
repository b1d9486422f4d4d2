"""The periodic reaper (a django-q2 schedule): recovers work whose worker died.

A running dispatch or orchestrator step whose lease expired is handed out again, up to
ASSISTANT_MAX_STEP_ATTEMPTS deliveries; past that it is dead-lettered with an error the
user sees. Work queued longer than a lease ago and still unclaimed is queued again: its
task may have died with a killed cluster (a duplicate delivery is a no-op claim). A
waiting turn whose agents are all done is woken, and so is a delegating agent waiting
on its own agents, in case the wake-up was lost with a worker.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orchestration import dispatches as lifecycle
from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, Turn, TurnStatus
from orchestration.records.catalogue import AGENT_FAILED
from orchestration.records.events import event_record
from orchestration.tasks import enqueue_orchestrator_step, enqueue_subagent, enqueue_subagents
from orchestration.turns import turn_fail

logger = logging.getLogger(__name__)


def reap_expired() -> dict:
    now = timezone.now()
    counts = {"dispatches_requeued": 0, "dispatches_dead": 0, "turns_requeued": 0, "turns_dead": 0, "turns_woken": 0,
              "parents_woken": 0, "queued_again": 0}
    for dispatch in AgentDispatch.objects.filter(state=DispatchState.RUNNING, lease_expires_at__lt=now):
        counts["dispatches_dead" if _reap_dispatch(dispatch) else "dispatches_requeued"] += 1
    for turn in Turn.objects.filter(status=TurnStatus.RUNNING, lease_expires_at__lt=now):
        if turn.step_attempts >= settings.ASSISTANT_MAX_STEP_ATTEMPTS:
            turn_fail(turn_id=turn.pk, token=turn.lease_token,
                      error=f"The orchestrator's worker stopped {turn.step_attempts} times; giving up (dead-lettered).")
            counts["turns_dead"] += 1
        elif Turn.objects.filter(pk=turn.pk, lease_token=turn.lease_token).update(lease_token="", lease_expires_at=None):
            enqueue_orchestrator_step(turn.pk)
            counts["turns_requeued"] += 1
    counts["queued_again"] = _requeue_unclaimed(now - timedelta(seconds=settings.ASSISTANT_LEASE_SECONDS))
    for turn in Turn.objects.filter(status=TurnStatus.WAITING):
        with transaction.atomic():
            counts["turns_woken"] += lifecycle.orchestrator_wake_if_ready(lifecycle.lock_turn(turn.pk))
    waiting_parents = AgentDispatch.objects.filter(
        state=DispatchState.CREATED, turn__status__in=[TurnStatus.RUNNING, TurnStatus.WAITING]
    ).exclude(awaiting={})
    for turn_id in set(waiting_parents.values_list("turn_id", flat=True)):
        with transaction.atomic():
            started = lifecycle.dispatch_schedule(lifecycle.lock_turn(turn_id))
            counts["parents_woken"] += sum(1 for d in started if d.awaiting)
    if any(counts.values()):
        logger.warning("Reaper: %s", counts)
    return counts


def _requeue_unclaimed(queued_before) -> int:
    turns = Turn.objects.filter(status=TurnStatus.RUNNING, lease_token="", queued_at__lt=queued_before)
    dispatches = AgentDispatch.objects.filter(
        state=DispatchState.CREATED, queued_at__lt=queued_before,
        turn__status__in=[TurnStatus.RUNNING, TurnStatus.WAITING],
    )
    turn_ids = list(turns.values_list("pk", flat=True))
    dispatch_ids = list(dispatches.values_list("pk", flat=True))
    for turn_id in turn_ids:
        enqueue_orchestrator_step(turn_id)
    if dispatch_ids:
        enqueue_subagents(dispatch_ids)
    return len(turn_ids) + len(dispatch_ids)


@transaction.atomic
def _reap_dispatch(dispatch: AgentDispatch) -> bool:
    """Re-queue, or dead-letter past the attempt limit. True when dead-lettered."""
    if dispatch.attempts >= settings.ASSISTANT_MAX_STEP_ATTEMPTS:
        error = f"The worker stopped {dispatch.attempts} times; giving up (dead-lettered)."
        now = timezone.now()
        if lifecycle.transition(
            dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.FAILED,
            where={"lease_token": dispatch.lease_token}, outcome=DispatchOutcome.FAILED, error=error,
            result=error, finished_at=now, lease_token="", lease_expires_at=None,
        ):
            event_record(type=AGENT_FAILED, dispatch=dispatch, summary=f"{dispatch.agent_id} failed: dead-lettered",
                         payload={"sub_agent_id": dispatch.agent_id, "outcome": "failed", "error": error})
            lifecycle.dispatch_usage_settle(dispatch)
            lifecycle.dispatch_settle(turn_id=dispatch.turn_id, dispatch=dispatch)
        return True
    if lifecycle.transition(dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.CREATED,
                            where={"lease_token": dispatch.lease_token}, lease_token="", lease_expires_at=None):
        enqueue_subagent(dispatch.pk)
    return False
