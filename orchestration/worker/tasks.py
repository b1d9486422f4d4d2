"""The django-q2 tasks: one delivery of an orchestrator step or of an agent, run by the
step machine (orchestration/engine/loop.py) on this process's runner, or inline where
there is none (tests, `manage.py ask --sync`).

A task that finds its runner full waits for a slot (the process takes no other task
meanwhile: backpressure); if none frees before django-q2's timeout would kill the
process, it lets go and the reaper queues the work again once it is a lease old. A
process that is ending gives the task back to the queue for another one.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.conf import settings
from django_q.tasks import async_task

from orchestration.delivery import runner
from orchestration.delivery.queue import AGENT, JOBS, ORCHESTRATOR, TASKS, Claimed
from orchestration.engine import loop
from orchestration.engine.agent import Agent
from orchestration.engine.orchestrator import Orchestrator

ROLES = {ORCHESTRATOR: Orchestrator, AGENT: Agent}


def _job(kind: str):
    role = ROLES[kind]

    async def job(item: int | Claimed) -> None:
        await loop.run(role, item)

    job.__qualname__ = f"run[{kind}]"
    return job


JOBS.update({kind: _job(kind) for kind in ROLES})


def _run(kind: str, item_id: int) -> None:
    """A task's body: the work on this process's runner, or inline where there is none."""
    here = runner.current()
    if here is None:
        async_to_sync(JOBS[kind])(item_id)
    elif not here.start(JOBS[kind], item_id, wait=_slot_wait_seconds()) and here.draining:
        async_task(TASKS[kind], item_id)  # this process is ending: another one takes it


def _slot_wait_seconds() -> float:
    return max(1.0, settings.Q_CLUSTER["timeout"] - 30.0)


def orchestrator_step(turn_id: int) -> None:
    _run(ORCHESTRATOR, turn_id)


def subagent_run(dispatch_id: int) -> None:
    _run(AGENT, dispatch_id)


def part_run(kind: str, item_ids: list[int]) -> None:
    """A shared wave's part (queue.py `deliver_all`): begun together on this runner, as
    far as it has room (one claim); the rest as their own tasks would."""
    here = runner.current()
    for item_id in item_ids if here is None else here.start_all(JOBS[kind], item_ids):
        _run(kind, item_id)
