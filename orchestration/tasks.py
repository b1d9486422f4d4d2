"""django-q2 entry points: thin, id-only, enqueued after the work's transaction commits.

Tasks may run twice (the ORM broker delivers at least once; the reaper re-queues): every
entry point starts with a conditional-update claim, so a second delivery does nothing.

Enqueueing stamps `queued_at` (the claim clears it). A cluster killed with tasks it had
already taken from the queue loses them until django-q2's `retry` (11 minutes by
default); the reaper re-queues work stamped longer ago than a lease and still unclaimed.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from orchestration.models import AgentDispatch, Turn


def enqueue_orchestrator_step(turn_id: int) -> None:
    Turn.objects.filter(pk=turn_id).update(queued_at=timezone.now())
    transaction.on_commit(lambda: async_task("orchestration.tasks.orchestrator_step", turn_id))


def enqueue_subagent(dispatch_id: int) -> None:
    enqueue_subagents([dispatch_id])


def enqueue_subagents(dispatch_ids: list[int]) -> None:
    AgentDispatch.objects.filter(pk__in=dispatch_ids).update(queued_at=timezone.now())
    for dispatch_id in dispatch_ids:
        transaction.on_commit(lambda dispatch_id=dispatch_id: async_task("orchestration.tasks.subagent_run", dispatch_id))


def orchestrator_step(turn_id: int) -> None:
    from orchestration.orchestrator import orchestrator_step as step

    step(turn_id=turn_id)


def subagent_run(dispatch_id: int) -> None:
    from orchestration.subagent import subagent_run as run

    run(dispatch_id=dispatch_id)


def reap() -> None:
    from orchestration.reaper import reap_expired

    reap_expired()
