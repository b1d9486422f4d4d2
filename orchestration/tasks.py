"""How work reaches a worker: django-q2 tasks, thin and id-only, enqueued after the
work's transaction commits. One way in: the queue brings work to a process, and work
that becomes ready inside a runner (a dependent whose last dependency finished, the
orchestrator its last agent wakes) may start on that runner when it has room.

Tasks may run twice (the ORM broker delivers at least once; the reaper re-queues): every
delivery starts with a conditional-update claim, so a second one does nothing.

Enqueueing stamps `queued_at` (the claim clears it). A task that finds its runner full
waits for a slot (the process takes no other task meanwhile: backpressure); if none
frees before django-q2's timeout would kill the process, it lets go, and the reaper's
one rule queues the work again once `queued_at` is a lease old, as it does for a task
lost with a killed cluster.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from orchestration import runner
from orchestration.models import AgentDispatch, Turn

TASKS = {"orchestrator": "orchestration.tasks.orchestrator_step", "agent": "orchestration.tasks.subagent_run"}


def _job(kind: str):
    """The coroutine that runs one delivery of `kind`: the step machine with its role."""
    from orchestration.engine import loop
    from orchestration.engine.agent import Agent
    from orchestration.engine.orchestrator import Orchestrator

    role = Orchestrator if kind == "orchestrator" else Agent

    async def job(item_id: int) -> None:
        await loop.run(role, item_id)

    job.__qualname__ = f"run[{kind}]"
    return job


def enqueue_orchestrator_step(turn_id: int) -> None:
    Turn.objects.filter(pk=turn_id).update(queued_at=timezone.now())
    transaction.on_commit(lambda: _deliver("orchestrator", turn_id))


def enqueue_subagent(dispatch_id: int) -> None:
    enqueue_subagents([dispatch_id])


def enqueue_subagents(dispatch_ids: list[int]) -> None:
    AgentDispatch.objects.filter(pk__in=dispatch_ids).update(queued_at=timezone.now())
    for dispatch_id in dispatch_ids:
        transaction.on_commit(lambda dispatch_id=dispatch_id: _deliver("agent", dispatch_id))


def _deliver(kind: str, item_id: int) -> None:
    """On this process's runner if it has a slot free now, else through the queue."""
    here = runner.current()
    if here is None or not here.start(_job(kind), item_id, wait=0):
        async_task(TASKS[kind], item_id)


def _run(kind: str, item_id: int) -> None:
    """A task's body: the work on this process's runner, or inline where there is none."""
    here = runner.current()
    if here is None:
        async_to_sync(_job(kind))(item_id)
    elif not here.start(_job(kind), item_id, wait=_slot_wait_seconds()) and here.draining:
        async_task(TASKS[kind], item_id)  # this process is ending: another one takes it


def _slot_wait_seconds() -> float:
    return max(1.0, settings.Q_CLUSTER["timeout"] - 30.0)


def orchestrator_step(turn_id: int) -> None:
    _run("orchestrator", turn_id)


def subagent_run(dispatch_id: int) -> None:
    _run("agent", dispatch_id)
