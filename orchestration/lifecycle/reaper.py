"""The periodic reaper (a django-q2 schedule): finds work a dead worker left behind.

Two things, for every active turn, under its lock:

1. A lease that expired means the worker holding it died (a live one renews it at every
   step): that is a crash, counted on the work. Past ASSISTANT_MAX_STEP_ATTEMPTS crashes
   it is dead-lettered with an error the user sees; otherwise it is runnable again.
   Nothing else counts: pauses, waits, Continues and hand-backs are not crashes.
2. The schedule rule (orchestration/lifecycle/dispatches.py `dispatch_schedule`), with
   `stale_before` a lease ago: whatever can run and is neither held nor queued since
   then is queued again (its task may have died with a killed cluster; a duplicate
   delivery is a claim that does nothing), and whoever waits on agents that are all
   done is woken. Whatever interleaving left work runnable and unqueued, this finds it.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orchestration.lifecycle import dispatches as lifecycle
from orchestration.lifecycle.turns import turn_fail
from orchestration.models import WORKING_TURN_STATUSES, AgentDispatch, DispatchOutcome, DispatchState, Turn, TurnStatus
from orchestration.records.catalogue import AGENT_FAILED
from orchestration.records.events import event_record

logger = logging.getLogger(__name__)


def reap_expired() -> dict:
    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.ASSISTANT_LEASE_SECONDS)
    counts = {"crashes": 0, "dispatches_dead": 0, "turns_dead": 0, "queued_again": 0, "woken": 0}
    for turn_id in Turn.objects.filter(status__in=WORKING_TURN_STATUSES).values_list("pk", flat=True):
        _reap_turn(turn_id, now, stale_before, counts)
    if any(counts.values()):
        logger.warning("Reaper: %s", counts)
    return counts


@transaction.atomic
def _reap_turn(turn_id: int, now, stale_before, counts: dict) -> None:
    turn = lifecycle.lock_turn(turn_id)
    if turn.status not in WORKING_TURN_STATUSES:
        return
    for dispatch in turn.dispatches.filter(state=DispatchState.RUNNING, lease_expires_at__lt=now):
        counts["crashes"] += 1
        if _dispatch_crashed(dispatch):
            counts["dispatches_dead"] += 1
    expired = turn.lease_expires_at is not None and turn.lease_expires_at < now
    if turn.status == TurnStatus.RUNNING and turn.lease_token and expired:
        counts["crashes"] += 1
        crashes = turn.crashes + 1
        if crashes >= settings.ASSISTANT_MAX_STEP_ATTEMPTS:
            Turn.objects.filter(pk=turn.pk).update(crashes=crashes)  # as a dead-lettered agent's are
            turn_fail(turn_id=turn.pk, token=turn.lease_token,
                      error=f"The orchestrator's worker stopped {crashes} times; giving up (dead-lettered).")
            counts["turns_dead"] += 1
            return
        Turn.objects.filter(pk=turn.pk).update(crashes=crashes, lease_token="", lease_expires_at=None, queued_at=None)
        turn.lease_token, turn.queued_at = "", None
    dispatches = list(turn.dispatches.all())
    waiting = [turn.status == TurnStatus.WAITING, *(d.state == DispatchState.WAITING for d in dispatches)]
    counts["queued_again"] += len(lifecycle.dispatch_schedule(turn, dispatches, stale_before=stale_before))
    still = [turn.status == TurnStatus.WAITING, *(d.state == DispatchState.WAITING for d in dispatches)]
    counts["woken"] += sum(before and not after for before, after in zip(waiting, still))


def _dispatch_crashed(dispatch: AgentDispatch) -> bool:
    """Its worker died: runnable again, or dead-lettered past the crash limit (True)."""
    crashes = dispatch.crashes + 1
    if crashes < settings.ASSISTANT_MAX_STEP_ATTEMPTS:
        lifecycle.transition(dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.CREATED,
                             where={"lease_token": dispatch.lease_token}, crashes=crashes, lease_token="",
                             lease_expires_at=None, queued_at=None)
        return False
    error = f"The worker stopped {crashes} times; giving up (dead-lettered)."
    if lifecycle.transition(
        dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.FAILED,
        where={"lease_token": dispatch.lease_token}, outcome=DispatchOutcome.FAILED, error=error, crashes=crashes,
        result=error, finished_at=timezone.now(), lease_token="", lease_expires_at=None,
    ):
        event_record(type=AGENT_FAILED, dispatch=dispatch, summary=f"{dispatch.agent_id} failed: dead-lettered",
                     payload={"sub_agent_id": dispatch.agent_id, "outcome": "failed", "error": error})
        lifecycle.dispatch_usage_settle(dispatch)
        lifecycle.dispatch_settle(turn_id=dispatch.turn_id, dispatch=dispatch)
    return True
