"""How work reaches a worker: django-q2 tasks, thin and id-only, enqueued after the
work's transaction commits.

Tasks may run twice (the ORM broker delivers at least once; the reaper re-queues): every
job starts with a conditional-update claim, so a second delivery does nothing.

A task hands its job to the process's runner (orchestration/runner.py) and returns. Work
that becomes ready inside a runner (a dependent whose last dependency finished, the
orchestrator its last agent wakes) starts on that runner when it has room: no queue hop.

Enqueueing stamps `queued_at` (the claim clears it). A cluster killed with tasks it had
already taken from the queue loses them until django-q2's `retry` (11 minutes by
default); the reaper re-queues work stamped longer ago than a lease and still unclaimed.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.tasks import async_task

from orchestration import runner
from orchestration.models import AgentDispatch, Turn

# A full runner makes the task wait this long for a slot, then puts it back on the queue
# for another process: well below django-q2's task timeout, which kills the process.
RUNNER_WAIT_SECONDS = 30.0

JOBS = {  # task → the coroutine that does the work, given the task's id
    "orchestrator_step": "orchestration.orchestrator.orchestrator_run",
    "subagent_run": "orchestration.subagent.agent_run",
}


def enqueue_orchestrator_step(turn_id: int) -> None:
    Turn.objects.filter(pk=turn_id).update(queued_at=timezone.now())
    transaction.on_commit(lambda: _deliver("orchestrator_step", turn_id))


def enqueue_subagent(dispatch_id: int) -> None:
    enqueue_subagents([dispatch_id])


def enqueue_subagents(dispatch_ids: list[int]) -> None:
    AgentDispatch.objects.filter(pk__in=dispatch_ids).update(queued_at=timezone.now())
    for dispatch_id in dispatch_ids:
        transaction.on_commit(lambda dispatch_id=dispatch_id: _deliver("subagent_run", dispatch_id))


def _deliver(task: str, item_id: int) -> None:
    """On this process's runner if it has a slot free now, else through the queue."""
    here = runner.current()
    if here is None or not here.start(import_string(JOBS[task]), item_id, wait=0):
        async_task(f"orchestration.tasks.{task}", item_id)


def _run(task: str, item_id: int) -> None:
    """A task's body: the job on this process's runner, or inline where there is none."""
    job = import_string(JOBS[task])
    here = runner.current()
    if here is None:
        async_to_sync(job)(item_id)
    elif not here.start(job, item_id, wait=RUNNER_WAIT_SECONDS):
        async_task(f"orchestration.tasks.{task}", item_id)


def orchestrator_step(turn_id: int) -> None:
    _run("orchestrator_step", turn_id)


def subagent_run(dispatch_id: int) -> None:
    _run("subagent_run", dispatch_id)

