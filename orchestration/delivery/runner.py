"""Where a worker process runs its agents (DESIGN.md §4, "Waiting is not work").

A model call takes seconds; a step's CPU work takes milliseconds. So a qcluster worker
process does not sit in one agent's model call: it hosts one runner, an asyncio loop on
a thread of its own, where every agent and orchestrator step it was handed runs as a
task (orchestration/engine/loop.py). A task awaits the model (the SDK's async client)
and hands the rest to two small pools of threads, each thread with its own connection:

- `db`: the engine's bookkeeping (claims, heartbeats, storing answers, scheduling);
- `skills`: acting on skill calls, which may take up to a skill's timeout.

Apart, so that eight slow skills cannot hold up a heartbeat, a claim or another agent's
step. A process holds a bounded number of connections however many agents it has in
flight, and checks a connection that sat idle before it uses it again (what Django's
CONN_HEALTH_CHECKS does once a request), so a restarted database costs one failed step,
retried (orchestration/delivery/dbretry.py), not a dead thread.

django-q2 brings the work (orchestration/worker/tasks.py); work that becomes ready here (an
agent's dependents, the orchestrator its last agent wakes) starts here when there is
room, with no queue hop. Outside a qcluster worker (inline tasks in tests, `manage.py
ask --sync`) there is no runner: the same coroutines run to the end on a temporary loop
and their database work runs in the calling thread.

When the worker process ends (django-q2 recycles it, or the cluster stops) the runner
drains: it takes no new work and lets what is in flight finish for up to
ASSISTANT_RUNNER_DRAIN_SECONDS; then each piece of work hands itself back to the queue at
its next step, after the model call it is in (and its SDK retries) has been answered and
stored; a call still open after that is cut short and handed back at once. Its stored
steps replay elsewhere. The process exits once none is left; nothing waits out a lease.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import util

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from orchestration.delivery.dbretry import fresh_connection
from orchestration.llm.base import pool_connections_on, pools_close

logger = logging.getLogger(__name__)

# A thread's connection idle longer than this is checked before use (one SELECT 1).
HEALTH_CHECK_IDLE_SECONDS = 5.0
# After whatever model calls were still in flight are cut short: the time their
# hand-backs (one short transaction each) may take.
HAND_BACK_SECONDS = 10.0
# Then, with nothing in flight, the time closing the model clients' pools may take.
POOLS_CLOSE_SECONDS = 2.0

Job = Callable[..., Awaitable[None]]  # of an id, or of work claimed already (delivery/queue.py)


class Runner:
    def __init__(self, *, capacity: int, db_threads: int, skill_threads: int):
        self.capacity = capacity
        self.loop = asyncio.new_event_loop()
        pool_connections_on(self.loop)
        self.db_executor = ThreadPoolExecutor(db_threads, thread_name_prefix="runner-db")
        self.skill_executor = ThreadPoolExecutor(skill_threads, thread_name_prefix="runner-skill")
        self.loop.set_default_executor(self.db_executor)
        self._slots = threading.BoundedSemaphore(capacity)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._tasks: set[asyncio.Task] = set()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.draining = False  # no new work
        self.handing_back = False  # and what is in flight goes back to the queue
        self._thread = threading.Thread(target=self._run_loop, name="runner-loop", daemon=True)
        self._thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self, job: Job, item_id: int, *, wait: float) -> bool:
        """Run `job(item_id)` here, if a slot frees within `wait` seconds (and the
        runner is not draining); False otherwise, and nothing was started."""
        if self.draining:
            return False
        if not (self._slots.acquire(timeout=wait) if wait else self._slots.acquire(blocking=False)):
            return False
        if self.draining:
            self._slots.release()
            return False
        self._begin(job, [item_id])
        return True

    def start_all(self, job: Job, item_ids: list[int]) -> list[int]:
        """Run `job` for each of `item_ids` that has a slot free now, all begun in the same
        turn of the loop (so that their claims go in one transaction: loop.py); the ids
        it had no room for."""
        started = []
        for item_id in item_ids:
            if self.draining or not self._slots.acquire(blocking=False):
                break
            started.append(item_id)
        if started:
            self._begin(job, started)
        return item_ids[len(started):]

    def room(self) -> int:
        """How much more work it would begin now (advisory: `start_claimed`)."""
        return 0 if self.draining else max(0, self.capacity - self.in_flight)

    def start_claimed(self, job: Job, items: list) -> None:
        """Begin work claimed for this runner in a transaction that has just committed
        (delivery/queue.py `begin_here`), all in one turn of the loop. It is begun
        whatever happened since that transaction found room: a slot taken meanwhile by a
        task, or the process beginning to drain. The work already holds its lease, and
        left waiting it would only wait for the reaper; over the capacity it is
        counted in without a slot, and a drain hands it back at its next step."""
        slotted = [self._slots.acquire(blocking=False) for _ in items]
        self._begin(job, items, slotted)

    def _begin(self, job: Job, item_ids: list, slotted: list[bool] | None = None) -> None:
        """Count in work (its slots taken, unless `slotted` says not), and create its
        tasks on the loop."""
        with self._lock:
            self.in_flight += len(item_ids)
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.loop.call_soon_threadsafe(self._create_tasks, job, item_ids, slotted or [True] * len(item_ids))

    def _create_tasks(self, job: Job, item_ids: list, slotted: list[bool]) -> None:
        for item_id, slot in zip(item_ids, slotted):
            task = self.loop.create_task(self._run(job, item_id, slot))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, job: Job, item_id, slot: bool) -> None:
        try:
            await job(item_id)
        except asyncio.CancelledError:
            pass  # handed back (engine/loop.py), or cancelled before it began
        except Exception:  # the job's own handlers record what went wrong; this is a bug
            logger.exception("Runner: %s(%s) failed", getattr(job, "__qualname__", job), item_id)
        finally:
            if slot:
                self._slots.release()
            with self._lock:
                self.in_flight -= 1
                self._idle.notify_all()

    def drain(self, finish_within: float, call_within: float) -> None:
        """Stop taking work; let what is in flight finish for `finish_within` seconds;
        then each piece of work hands itself back at its next step, once the model call
        it is in (with the SDK's retries: `call_within`) has been answered and stored,
        so no answer is paid for twice; whatever is still in a call after that is cut
        short and hands back at once. Nothing is left to wait out a lease."""
        self.draining = True
        with self._lock:
            finished = self._idle.wait_for(lambda: self.in_flight == 0, timeout=finish_within)
        if not finished:
            self.handing_back = True
            with self._lock:
                finished = self._idle.wait_for(lambda: self.in_flight == 0, timeout=call_within)
        if not finished:
            self.loop.call_soon_threadsafe(self._cancel_all)
            with self._lock:
                self._idle.wait_for(lambda: self.in_flight == 0, timeout=HAND_BACK_SECONDS)
        if self.in_flight:
            logger.warning("Runner: %s still in flight at exit; their leases will expire", self.in_flight)
        else:
            self._pools_close()
        self.db_executor.shutdown(wait=False, cancel_futures=True)
        self.skill_executor.shutdown(wait=False, cancel_futures=True)

    def _pools_close(self) -> None:
        """Close the model clients' connection pools kept on the loop, now that no work
        uses them (a pool that will not close is left to the process's exit)."""
        if not self.loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(pools_close(), self.loop).result(timeout=POOLS_CLOSE_SECONDS)
        except Exception:
            logger.warning("Runner: the model clients' connections did not close", exc_info=True)

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


_runner: Runner | None = None


def current() -> Runner | None:
    """This process's runner, if it is a qcluster worker that started one."""
    return _runner


def runner_start() -> Runner:
    """Start this worker process's runner; drain it when the process ends."""
    global _runner
    workers = max(1, settings.Q_CLUSTER["workers"])
    _runner = Runner(capacity=math.ceil(settings.ASSISTANT_AGENTS_IN_FLIGHT / workers),
                     db_threads=settings.ASSISTANT_RUNNER_DB_THREADS,
                     skill_threads=settings.ASSISTANT_RUNNER_SKILL_THREADS)
    # multiprocessing runs its finalizers when the process's target returns (django-q2's
    # worker loop ends on STOP or to recycle), before it joins the threads and exits.
    one_call = settings.ASSISTANT_LLM_TIMEOUT_SECONDS * (settings.ASSISTANT_LLM_MAX_RETRIES + 1)
    util.Finalize(None, _runner.drain, args=(settings.ASSISTANT_RUNNER_DRAIN_SECONDS, one_call), exitpriority=10)
    return _runner


def handing_back() -> bool:
    """Whether work in flight on this process must go back to the queue now."""
    return _runner is not None and _runner.handing_back


async def db(fn: Callable, /, *args, **kwargs):
    """Run synchronous `fn` (the ORM) away from the event loop: on the runner's
    database threads, or inline in the thread that started the loop."""
    return await _on_pool(lambda runner: runner.db_executor, fn, args, kwargs)


async def skills(fn: Callable, /, *args, **kwargs):
    """Run synchronous `fn` that calls skills: on the runner's skill threads."""
    return await _on_pool(lambda runner: runner.skill_executor, fn, args, kwargs)


async def _on_pool(executor_of, fn: Callable, args: tuple, kwargs: dict):
    runner = current()
    if runner is not None and asyncio.get_running_loop() is runner.loop:
        call = functools.partial(contextvars.copy_context().run, _on_thread, fn, args, kwargs)
        return await runner.loop.run_in_executor(executor_of(runner), call)
    return await sync_to_async(functools.partial(_on_thread, fn, args, kwargs), thread_sensitive=True)()


_thread_state = threading.local()


def _on_thread(fn: Callable, args: tuple, kwargs: dict):
    last_used = getattr(_thread_state, "last_used", None)
    idle = last_used is not None and time.monotonic() - last_used > HEALTH_CHECK_IDLE_SECONDS
    if idle and not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()  # with CONN_HEALTH_CHECKS: checked at its next query
    try:
        return fn(*args, **kwargs)
    finally:
        _thread_state.last_used = time.monotonic()
        fresh_connection()  # a broken connection (a restarted server) is replaced
