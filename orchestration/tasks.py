"""django-q2 entry points: thin, id-only, enqueued after the work's transaction commits.

Tasks may run twice (the ORM broker delivers at least once; the reaper re-queues): every
entry point starts with a conditional-update claim, so a second delivery does nothing.
"""

from __future__ import annotations

from django.db import transaction
from django_q.tasks import async_task


def enqueue_orchestrator_step(turn_id: int) -> None:
    transaction.on_commit(lambda: async_task("orchestration.tasks.orchestrator_step", turn_id))


def enqueue_subagent(dispatch_id: int) -> None:
    transaction.on_commit(lambda: async_task("orchestration.tasks.subagent_run", dispatch_id))


def orchestrator_step(turn_id: int) -> None:
    from orchestration.orchestrator import orchestrator_step as step

    step(turn_id=turn_id)


def subagent_run(dispatch_id: int) -> None:
    from orchestration.subagent import subagent_run as run

    run(dispatch_id=dispatch_id)


def reap() -> None:
    from orchestration.reaper import reap_expired

    reap_expired()
