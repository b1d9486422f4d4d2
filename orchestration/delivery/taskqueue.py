"""django-q2's task queue, made safe for a worker to die while it waits on it.

Every qcluster worker takes its next task with `task_queue.get()`. A multiprocessing
queue's blocking get holds the queue's read lock (a semaphore shared by the processes)
for as long as it waits, and our workers are nearly always waiting: a task for an agent
hands it to the process's runner and returns at once (orchestration/delivery/runner.py). A worker
SIGKILLed (the OOM killer, an operator) mid-agent is therefore most likely the one holding
that lock, which then is never released: every other worker blocks on it for good and the
cluster freezes, though its processes look alive (django-q2 issue #23).

`guarded_get` waits for a task without the lock — polling the queue's pipe is safe from
any number of processes — and takes the lock only to read the one message that arrived,
which takes microseconds. A worker killed while waiting then holds nothing.

A worker whose runner has work in flight lets an idle one take a message first
(BUSY_YIELD_SECONDS): a wave of agents queued to spread over the cluster's processes
(queue.py `share_here`) would otherwise often go back to the busy process that queued
it, and the GIL it meant to leave.
"""

from __future__ import annotations

import time
from multiprocessing.reduction import ForkingPickler

from django_q.queues import Queue

from orchestration.delivery import runner

_LOCK_WAIT_SECONDS = 1.0  # then poll again: another worker may have taken the message
BUSY_YIELD_SECONDS = 0.002


def _busy() -> bool:
    here = runner.current()
    return here is not None and here.in_flight > 0


def guarded_get(self: Queue, block: bool = True, timeout: float | None = None):
    """Queue.get for the blocking, no-timeout case the workers use; the rest as before."""
    if not block or timeout is not None:
        return _original_get(self, block, timeout)
    if self._closed:
        raise ValueError(f"Queue {self!r} is closed")
    while True:
        self._reader.poll(None)  # wait, holding no lock
        if _busy():
            time.sleep(BUSY_YIELD_SECONDS)
        if not self._rlock.acquire(True, _LOCK_WAIT_SECONDS):
            continue
        try:
            if not self._poll():  # another worker read it first
                continue
            data = self._recv_bytes()
            self._sem.release()
        finally:
            self._rlock.release()
        self.size.increment(-1)  # django-q2's own count (Queue.get)
        return ForkingPickler.loads(data)


_original_get = Queue.get


def install() -> None:
    """Replace Queue.get; idempotent. Workers forked afterwards inherit it."""
    if Queue.get is not guarded_get:
        Queue.get = guarded_get
