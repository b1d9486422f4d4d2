"""Where a worker process runs its agents (DESIGN.md §4, "Waiting is not work").

A model call takes seconds; a step's CPU work takes milliseconds. So a qcluster worker
process does not sit in one agent's model call: it hosts one runner, an asyncio loop on
a thread of its own, where every agent and orchestrator step it was handed runs as a
task. A task awaits the model (the SDK's async client) and hands its database and skill
work (`db`) to a few threads that keep their own connections, so a process holds a
bounded number of connections however many agents it has in flight.

django-q2 still brings the work (orchestration/tasks.py): the task for an agent hands it
to the runner and returns, and the process goes back to the queue at once. While the
runner is full the task waits (backpressure), and past a while goes back on the queue
for another process. Work that becomes ready here (an agent's dependents, the
orchestrator its last agent wakes) starts here when there is room, with no queue hop.

Outside a qcluster worker (inline tasks in tests, `manage.py ask --sync`) there is no
runner: the same coroutines run to the end on a temporary loop and their database work
runs in the calling thread, as it always did.

When the worker process ends (django-q2 recycles it, or the cluster stops) the runner
drains: it takes no new work and lets what is in flight finish, for up to
ASSISTANT_RUNNER_DRAIN_SECONDS; then whatever is still in flight stops at its next step
and goes back to the queue (its stored steps replay elsewhere). The process exits once
none is left. (Handing back at once would never let an agent finish on workers that
are recycled often.)
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import util

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from orchestration.llm.base import pool_connections_on

logger = logging.getLogger(__name__)

DRAIN_SECONDS_PAST_A_MODEL_CALL = 30.0

Job = Callable[[int], Awaitable[None]]


class HandBack(Exception):
    """This process is ending: the work goes back to the queue at its next step."""


class Runner:
    def __init__(self, *, capacity: int, db_threads: int):
        self.capacity = capacity
        self.loop = asyncio.new_event_loop()
        pool_connections_on(self.loop)
        self.db_executor = ThreadPoolExecutor(db_threads, thread_name_prefix="runner-db")
        self.loop.set_default_executor(self.db_executor)
        self._slots = threading.BoundedSemaphore(capacity)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.in_flight = 0
        self.peak_in_flight = 0
        self.draining = False  # no new work
        self.handing_back = False  # and what is in flight stops at its next step
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
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        asyncio.run_coroutine_threadsafe(self._run(job, item_id), self.loop)
        return True

    async def _run(self, job: Job, item_id: int) -> None:
        try:
            await job(item_id)
        except Exception:  # the job's own handlers record what went wrong; this is a bug
            logger.exception("Runner: %s(%s) failed", getattr(job, "__qualname__", job), item_id)
        finally:
            self._slots.release()
            with self._lock:
                self.in_flight -= 1
                self._idle.notify_all()

    def drain(self, finish_within: float, hand_back_within: float) -> None:
        """Stop taking work; let what is in flight finish for `finish_within` seconds,
        then have the rest hand itself back at its next step, within `hand_back_within`."""
        self.draining = True
        with self._lock:
            if not self._idle.wait_for(lambda: self.in_flight == 0, timeout=finish_within):
                self.handing_back = True
                self._idle.wait_for(lambda: self.in_flight == 0, timeout=hand_back_within)
            left = self.in_flight
        if left:
            logger.warning("Runner: %s still in flight at exit; their leases will expire", left)
        self.db_executor.shutdown(wait=False, cancel_futures=True)


_runner: Runner | None = None


def current() -> Runner | None:
    """This process's runner, if it is a qcluster worker that started one."""
    return _runner


def runner_start() -> Runner:
    """Start this worker process's runner; drain it when the process ends."""
    global _runner
    workers = max(1, settings.Q_CLUSTER["workers"])
    _runner = Runner(capacity=math.ceil(settings.ASSISTANT_AGENTS_IN_FLIGHT / workers),
                     db_threads=settings.ASSISTANT_RUNNER_DB_THREADS)
    hand_back_within = settings.ASSISTANT_LLM_TIMEOUT_SECONDS + DRAIN_SECONDS_PAST_A_MODEL_CALL
    # multiprocessing runs its finalizers when the process's target returns (django-q2's
    # worker loop ends on STOP or to recycle), before it joins the threads and exits.
    util.Finalize(None, _runner.drain, args=(settings.ASSISTANT_RUNNER_DRAIN_SECONDS, hand_back_within),
                  exitpriority=10)
    return _runner


def handing_back() -> bool:
    """Whether work in flight on this process must stop at its next step (HandBack)."""
    return _runner is not None and _runner.handing_back


async def db(fn: Callable, /, *args, **kwargs):
    """Run synchronous `fn` (the ORM, skills) away from the event loop: on the runner's
    database threads, or inline in the thread that started the loop."""
    runner = current()
    if runner is not None and asyncio.get_running_loop() is runner.loop:
        call = functools.partial(contextvars.copy_context().run, _on_db_thread, fn, args, kwargs)
        return await runner.loop.run_in_executor(runner.db_executor, call)
    return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


def _on_db_thread(fn: Callable, args: tuple, kwargs: dict):
    try:
        return fn(*args, **kwargs)
    finally:
        if connection.errors_occurred:  # a broken connection (a restarted server) is replaced
            connection.close_if_unusable_or_obsolete()
