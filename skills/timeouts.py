"""A per-call deadline that interrupts a skill handler, on any thread.

django-q2 workers arm the same process timer (`signal.alarm`) for their own task
timeout, so `deadline` nests: it remembers the enclosing handler and timer, never
postpones an enclosing deadline that is sooner, and on exit restores the handler and
re-arms the enclosing timer with whatever time it has left (at once if none).

An exception raised in the middle of a database query would leave the connection busy
with it (psycopg only cleans up after Ctrl-C), and the rollback that follows would fail.
So queries are shielded: a deadline that expires during one cancels it on the server
and raises as soon as the query returns.

Signals only reach the main thread. On any other thread (a worker's runner runs skills
on its skill threads) a timer thread does what the alarm would, as a last resort behind
the cooperative deadlines a handler should meet first (socket timeouts such as
EMAIL_TIMEOUT): it raises in the
handler's thread between two bytecodes (PyThreadState_SetAsyncExc), or, if a query is
running there, cancels it on the server and raises once it returned. Code blocked in C
(a socket read, a sleep) is interrupted when it comes back to Python.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connection, connections

logger = logging.getLogger(__name__)

# setitimer(0) would disarm the timer instead of firing it: an expired enclosing
# deadline is re-armed with this instead.
_AT_ONCE = 1e-6


class SkillTimeout(BaseException):
    """The handler ran past its deadline.

    A BaseException, like KeyboardInterrupt, so that a handler's own `except Exception`
    cannot swallow it and carry on.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not finish within {seconds:g} s")
        self.seconds = seconds


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self.in_query = False

    def on_alarm(self, signum, frame) -> None:
        self.expired = True
        if self.in_query:
            _cancel_running_query()
            return
        raise SkillTimeout(self.seconds)

    def run_query(self, execute, sql, params, many, context):
        """Django execute_wrapper: defer an expiry to the end of the query."""
        if self.in_query:  # a query issued while running a query: already shielded
            return execute(sql, params, many, context)
        self.in_query = True
        try:
            return execute(sql, params, many, context)
        finally:
            self.in_query = False
            if self.expired:
                raise SkillTimeout(self.seconds)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise SkillTimeout inside the block once `seconds` have passed."""
    if threading.current_thread() is not threading.main_thread():
        with _thread_deadline(seconds):
            yield
        return
    limit = _Deadline(seconds)
    previous_handler = signal.getsignal(signal.SIGALRM)
    outer_left, outer_interval = signal.setitimer(signal.ITIMER_REAL, 0)
    started = time.monotonic()
    signal.signal(signal.SIGALRM, limit.on_alarm)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left else seconds)
    try:
        with connection.execute_wrapper(limit.run_query):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler or signal.SIG_DFL)
        if outer_left:
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, _AT_ONCE), outer_interval)
    if limit.expired:  # the block caught the SkillTimeout and went on: not for long
        raise SkillTimeout(seconds)


def _cancel_running_query() -> None:
    """Ask the server to stop the query in flight; the query then fails at once.

    Only PostgreSQL needs this: an SQLite query runs in C and the alarm's handler only
    runs after it returned."""
    if connection.vendor != "postgresql":
        return
    try:
        connection.connection.cancel_safe(timeout=2.0)
    except Exception:
        logger.warning("Could not cancel a query past its skill's deadline.", exc_info=True)


class _Expired(BaseException):
    """Raised into a thread whose deadline passed; turned into SkillTimeout at once."""


class _ThreadDeadline:
    """`_Deadline` for a thread that is not the main one: the timer thread calls
    `expire`. One lock orders it with the queries and the end of the block, so the
    exception is never raised into a query, nor after the block."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.thread_id = threading.get_ident()
        self.connection = connections[DEFAULT_DB_ALIAS]  # this thread's; the timer's is another
        self.lock = threading.Lock()
        self.expired = False
        self.in_query = False
        self.raised_into = False
        self.over = False

    def expire(self) -> None:
        with self.lock:
            if self.over:
                return
            self.expired = True
            if self.in_query:
                _cancel_query_of(self.connection)
                return
            self.raised_into = True
            _raise_in_thread(self.thread_id, _Expired)

    def run_query(self, execute, sql, params, many, context):
        with self.lock:
            if self.expired:
                raise SkillTimeout(self.seconds)
            nested = self.in_query
            self.in_query = True
        if nested:
            return execute(sql, params, many, context)
        try:
            return execute(sql, params, many, context)
        finally:
            with self.lock:
                self.in_query = False
                if self.expired:
                    raise SkillTimeout(self.seconds)

    def end(self) -> None:
        """No exception may arrive after this: one not raised yet is withdrawn."""
        with self.lock:
            self.over = True
            if self.raised_into:
                _raise_in_thread(self.thread_id, None)


@contextmanager
def _thread_deadline(seconds: float) -> Iterator[None]:
    limit = _ThreadDeadline(seconds)
    timer = threading.Timer(seconds, limit.expire)
    timer.daemon = True
    timer.start()
    try:
        try:
            with connection.execute_wrapper(limit.run_query):
                yield
        finally:
            timer.cancel()
            limit.end()
    except _Expired:
        limit.end()
        raise SkillTimeout(seconds) from None
    if limit.expired:  # the block caught the SkillTimeout and went on: not for long
        raise SkillTimeout(seconds)


def _raise_in_thread(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise `exception` in the thread at its next bytecode (None: withdraw a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception is not None else None
    )


def _cancel_query_of(wrapper) -> None:
    if wrapper is None or wrapper.vendor != "postgresql" or wrapper.connection is None:
        return
    try:
        wrapper.connection.cancel_safe(timeout=2.0)
    except Exception:
        logger.warning("Could not cancel a query past its skill's deadline.", exc_info=True)
