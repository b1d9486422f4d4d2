"""A per-call deadline that interrupts a skill handler (SIGALRM on the main thread).

django-q2 workers arm the same process timer (`signal.alarm`) for their own task
timeout, so `deadline` nests: it remembers the enclosing handler and timer, never
postpones an enclosing deadline that is sooner, and on exit restores the handler and
re-arms the enclosing timer with whatever time it has left (at once if none).

Signals only reach the main thread. Elsewhere (a web request in a thread pool) the
handler cannot be interrupted: it runs to the end and an overrun is reported as a
timeout afterwards, so the caller still rolls its writes back.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise SkillTimeout inside the block once `seconds` have passed."""
    if threading.current_thread() is not threading.main_thread():
        yield from _measured(seconds)
        return
    previous_handler = signal.getsignal(signal.SIGALRM)
    outer_left, outer_interval = signal.setitimer(signal.ITIMER_REAL, 0)
    started = time.monotonic()

    def on_alarm(signum, frame):
        raise SkillTimeout(seconds)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler or signal.SIG_DFL)
        if outer_left:
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, _AT_ONCE), outer_interval)


def _measured(seconds: float) -> Iterator[None]:
    started = time.monotonic()
    yield
    if time.monotonic() - started > seconds:
        raise SkillTimeout(seconds)
