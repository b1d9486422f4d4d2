"""deadline(): interrupts on the main thread, nests with an enclosing SIGALRM timer (as
django-q2 workers arm one, and as pytest-timeout does around every test here), and
interrupts on other threads too (a worker's runner runs skills on its database threads)."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection, transaction

from skills.timeouts import SkillTimeout, deadline


class WorkerTimeout(BaseException):
    """Stands in for django-q2's own task timeout."""


@pytest.fixture
def worker_timer():
    """`arm(seconds)`: an enclosing SIGALRM timer with its own handler, as a worker has."""

    def on_alarm(signum, frame):
        raise WorkerTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    previous_left, _interval = signal.getitimer(signal.ITIMER_REAL)

    def arm(seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, seconds)

    yield arm
    signal.signal(signal.SIGALRM, previous)
    signal.setitimer(signal.ITIMER_REAL, previous_left)


@pytest.fixture
def no_timer():
    """No enclosing timer (pytest-timeout's is put back afterwards)."""
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    previous_left, _interval = signal.setitimer(signal.ITIMER_REAL, 0)
    yield
    signal.signal(signal.SIGALRM, previous)
    signal.setitimer(signal.ITIMER_REAL, previous_left)


def test_interrupts_a_block_that_runs_too_long(no_timer):
    started = time.monotonic()
    with pytest.raises(SkillTimeout, match=r"did not finish within 0.05 s"), deadline(0.05):
        time.sleep(2)
    assert time.monotonic() - started < 1
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL


def test_a_quick_block_is_left_alone(no_timer):
    with deadline(5):
        pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL


def test_an_enclosing_timer_is_restored_with_its_time_left(worker_timer):
    worker_timer(5)
    with pytest.raises(SkillTimeout), deadline(0.05):
        time.sleep(1)
    left, _interval = signal.getitimer(signal.ITIMER_REAL)
    assert 4 < left < 5
    assert signal.getsignal(signal.SIGALRM).__name__ == "on_alarm"


def test_an_enclosing_timer_that_is_sooner_still_fires(worker_timer):
    worker_timer(0.05)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout), deadline(10):
        time.sleep(2)
    assert time.monotonic() - started < 1


def test_an_enclosing_timer_that_expires_inside_fires_right_after(worker_timer):
    worker_timer(0.05)
    with pytest.raises(WorkerTimeout):
        with deadline(10):
            # Busy, not sleeping: the alarm lands wherever the block happens to be.
            end = time.monotonic() + 0.2
            while time.monotonic() < end:
                pass
        time.sleep(1)


def in_a_thread(work):
    """Run `work()` on another thread; what it returned or raised."""
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return outcome


def test_off_the_main_thread_a_busy_block_is_interrupted():
    def work():
        with deadline(0.05):
            end = time.monotonic() + 5
            while time.monotonic() < end:
                pass

    started = time.monotonic()
    outcome = in_a_thread(work)
    assert isinstance(outcome["raised"], SkillTimeout) and outcome["raised"].seconds == 0.05
    assert time.monotonic() - started < 1


def test_off_the_main_thread_a_block_that_catches_everything_still_times_out():
    def work():
        with deadline(0.05):
            try:
                end = time.monotonic() + 5
                while time.monotonic() < end:
                    pass
            except Exception:  # a handler's own broad except cannot swallow the deadline
                return "swallowed"

    assert isinstance(in_a_thread(work)["raised"], SkillTimeout)


def test_off_the_main_thread_a_quick_block_is_left_alone_and_nothing_arrives_later():
    def work():
        with deadline(0.05):
            pass
        time.sleep(0.2)  # the timer would have fired by now
        return "done"

    assert in_a_thread(work) == {"value": "done"}


def test_off_the_main_thread_a_sleep_is_interrupted_when_it_returns():
    def work():
        with deadline(0.01):
            time.sleep(0.1)  # blocked in C: the exception arrives when it is back

    assert isinstance(in_a_thread(work)["raised"], SkillTimeout)


@pytest.mark.django_db(transaction=True)
def test_off_the_main_thread_a_query_is_never_interrupted_half_way():
    """As on the main thread: the timer lands during the query; the timeout comes once it
    returned (PostgreSQL cancels it), and the thread's connection goes on working."""
    slow = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000) "
        "SELECT count(*) FROM n"
    )

    def work():
        counted = []
        query = slow if connection.vendor == "sqlite" else "SELECT pg_sleep(1), 1"
        try:
            with transaction.atomic(), deadline(0.01), connection.cursor() as cursor:
                cursor.execute(query)
                counted.append(cursor.fetchone())
        except SkillTimeout:
            pass
        else:
            return "no timeout"
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            ok = cursor.fetchone()
        connection.close()
        return counted, ok

    assert in_a_thread(work) == {"value": ([], (1,))}


def test_a_query_is_never_interrupted_half_way(db, no_timer):
    """The alarm lands during the query; the timeout is raised once it has returned (or
    PostgreSQL cancelled it), and after rolling back to a savepoint, as the executor
    does, the connection goes on working."""
    counted = []
    slow = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000) "
        "SELECT count(*) FROM n"
    )
    query = slow if connection.vendor == "sqlite" else "SELECT pg_sleep(1), 1"
    with (
        pytest.raises(SkillTimeout),
        transaction.atomic(),
        deadline(0.01),
        connection.cursor() as cursor,
    ):
        cursor.execute(query)
        counted.append(cursor.fetchone())
    assert counted == []  # the block stopped right after the query
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
