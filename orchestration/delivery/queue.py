"""How work is put on its way to a worker: django-q2 tasks, thin and id-only, enqueued
after the work's transaction commits. One way in: the queue brings work to a process, and
work that becomes ready inside a runner (a dependent whose last dependency finished, the
orchestrator its last agent wakes) may start on that runner when it has room.

Tasks may run twice (the ORM broker delivers at least once; the reaper re-queues): every
delivery starts with a conditional-update claim, so a second one does nothing.

Enqueueing stamps `queued_at` (the claim clears it); the reaper's one rule queues work
again once its stamp is a lease old and nobody claimed it (its task lost with a killed
cluster).

Work that becomes ready inside a runner and begins on it is claimed in the transaction
that made it ready (`here_share`, `begin_here`): no queue, no stamp, and no claim of its
own, which was a commit of its own between a hand-off and the next model call.

What runs a delivery is registered here by worker/tasks.py, which knows the engine: the
engine's bookkeeping can enqueue without importing the engine back.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import NamedTuple

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
# kind → the coroutine that runs one delivery (worker/tasks.py registers them): of an id,
# or of work claimed already (`Claimed`)
JOBS: dict[str, Callable[[int | Claimed], Awaitable[None]]] = {}


class Claimed(NamedTuple):
    """Work claimed for this process's runner in the transaction that made it ready: its
    delivery begins with this lease, and claims nothing (engine/loop.py)."""

    item_id: int
    token: str
    counted: bool = False  # an agent's first model call is counted against the turn's cap


def enqueue_orchestrator_step(turn_id: int, *, stamped: bool = False) -> None:
    """Deliver the turn's next step after the commit; `stamped`: the caller's own UPDATE
    of the turn set its `queued_at` (one statement less)."""
    if not stamped:
        Turn.objects.filter(pk=turn_id).update(queued_at=timezone.now())
    transaction.on_commit(lambda: deliver(ORCHESTRATOR, turn_id))


def enqueue_subagent(dispatch_id: int) -> None:
    enqueue_subagents([dispatch_id])


def enqueue_subagents(dispatch_ids: list[int], *, parts_of: int = 0) -> None:
    """Stamp the agents queued and deliver them after the commit (`deliver_all`); with
    `parts_of`, the rest of a wave whose share was begun here (`begin_here`): each other
    share, of that many, as one task for another process."""
    AgentDispatch.objects.filter(pk__in=dispatch_ids).update(queued_at=timezone.now())
    ids = list(dispatch_ids)
    transaction.on_commit(lambda: _queue_parts(AGENT, ids, parts_of) if parts_of else deliver_all(AGENT, ids))


def here_share(kind: str, ready: int) -> int:
    """How many of `ready` pieces of work, becoming ready in the caller's transaction,
    begin on this process's runner, claimed in that transaction (`begin_here`): its
    share of them (`share_here`), as far as it has room; none outside a runner."""
    here = runner.current()
    if here is None or kind not in JOBS or here.draining:
        return 0
    return min(share_here(here.in_flight, ready), here.room())


def begin_here(kind: str, claimed: list[Claimed]) -> None:
    """Begin work the caller's transaction claimed for this runner, once it commits."""
    here = runner.current()
    transaction.on_commit(lambda: here.start_claimed(JOBS[kind], claimed))


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
        _queue_parts(kind, item_ids[share:], share)
    for item_id in queued:
        async_task(TASKS[kind], item_id)


def _queue_parts(kind: str, item_ids: list[int], part: int) -> None:
    for start in range(0, len(item_ids), part):  # a part for each other worker
        async_task(PART_TASK, kind, item_ids[start:start + part])


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
