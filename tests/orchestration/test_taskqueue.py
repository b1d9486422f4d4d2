"""A qcluster worker SIGKILLed while it waits for a task must not freeze the others.

Real processes on a real django-q2 queue: one waits in get() and is killed; another
must still receive the next task (with multiprocessing's own get the killed process
took the queue's read lock with it and the second waited forever)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from django_q.queues import Queue

from orchestration.delivery import taskqueue


def _take(queue: Queue, out: Queue) -> None:
    out.put(queue.get())


def test_a_worker_killed_while_waiting_leaves_the_queue_working():
    taskqueue.install()
    tasks, taken = Queue(), Queue()
    doomed = multiprocessing.Process(target=_take, args=(tasks, taken))
    doomed.start()
    time.sleep(0.5)  # it is waiting in get()
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(5)
    survivor = multiprocessing.Process(target=_take, args=(tasks, taken))
    survivor.start()
    tasks.put("task-1")
    assert taken.get(timeout=10) == "task-1"
    survivor.join(5)
    assert tasks.qsize() == 0


def test_several_waiting_workers_each_take_one_task():
    taskqueue.install()
    tasks, taken = Queue(), Queue()
    workers = [multiprocessing.Process(target=_take, args=(tasks, taken)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for n in range(4):
        tasks.put(f"task-{n}")
    assert sorted(taken.get(timeout=10) for _ in range(4)) == [f"task-{n}" for n in range(4)]
    for worker in workers:
        worker.join(5)
        assert worker.exitcode == 0
