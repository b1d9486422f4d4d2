"""How work is put on its way to a worker: django-q2 tasks, thin and id-only, enqueued
after the work's transaction commits. One way in: the queue brings work to a process, and
work that becomes ready inside a runner (a dependent whose last dependency finished, the
orchestrator its last agent wakes) may start on that runner when it has room.

Tasks may run twice (the ORM broker delivers at least once; the reaper re-queues): every
delivery starts with a conditional-update claim, so a second one does nothing.

Enqueueing stamps `queued_at` (the claim clears it); the reaper's one rule queues work
again once its stamp is a lease old and nobody claimed it (its task lost with a killed
cluster). What runs a delivery is registered here by worker/tasks.py, which knows the
engine: the engine's bookkeeping can enqueue without importing the engine back.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.tasks import async_task

from orchestration.delivery import broker, runner
from orchestration.models import AgentDispatch, Turn

ORCHESTRATOR, AGENT = "orchestrator", "agent"
TASKS = {ORCHESTRATOR: "orchestration.worker.tasks.orchestrator_step",
         AGENT: "orchestration.worker.tasks.subagent_run"}
# One task for a shared wave's part: (kind, ids), begun together where it is taken.
PART_TASK = "orchestration.worker.tasks.part_run"
# kind → the coroutine that runs one delivery (worker/tasks.py registers them)
JOBS: dict[str, Callable[[int], Awaitable[None]]] = {}


def enqueue_orchestrator_step(turn_id: int, *, stamped: bool = False) -> None:
    """Deliver the turn's next step after the commit; `stamped`: the caller's own UPDATE
    of the turn set its `queued_at` (one statement less)."""
    if not stamped:
        Turn.objects.filter(pk=turn_id).update(queued_at=timezone.now())
    transaction.on_commit(lambda: deliver(ORCHESTRATOR, turn_id))


def enqueue_subagent(dispatch_id: int) -> None:
    enqueue_subagents([dispatch_id])


def enqueue_subagents(dispatch_ids: list[int]) -> None:
    AgentDispatch.objects.filter(pk__in=dispatch_ids).update(queued_at=timezone.now())
    transaction.on_commit(lambda: deliver_all(AGENT, list(dispatch_ids)))


def deliver(kind: str, item_id: int) -> None:
    """On this process's runner if it has a slot free now, else through the queue."""
    deliver_all(kind, [item_id])


def deliver_all(kind: str, item_ids: list[int]) -> None:
    """`deliver` for work that became ready together: its share begun together on this
    runner, as far as it has room (their claims then share a transaction), the rest
    queued: each of the other shares as one task, begun together where it is taken."""
    here = runner.current()
    job = JOBS.get(kind)
    if here is None or job is None:
        queued = item_ids
    else:
        share = share_here(here.in_flight, len(item_ids))
        queued = here.start_all(job, item_ids[:share])
        for start in range(share, len(item_ids), share):  # a part for each other worker
            async_task(PART_TASK, kind, item_ids[start:start + share])
    for item_id in queued:
        async_task(TASKS[kind], item_id)


def share_here(in_flight: int, ready: int) -> int:
    """How many of `ready` pieces of work a runner with `in_flight` begins itself.

    All of them, unless they are a wave larger than what it already runs, on a cluster of
    several worker processes whose queue is taken at once. Then only its share: one
    process runs its agents' steps one after another under its GIL while the others'
    cores idle (`wide`'s eight agents: a step waited 40 ms at p50, 15 ms spread over two
    processes). A runner already busy keeps its own: the other processes are busy too,
    and queueing would only add its statements. Tasks run inline (django-q2's sync) have
    no other process to go to."""
    workers = settings.Q_CLUSTER["workers"]
    if ready < 2 or workers < 2 or Conf.SYNC or in_flight >= ready or not broker.wakes_on_enqueue():
        return ready
    return math.ceil(ready / workers)
