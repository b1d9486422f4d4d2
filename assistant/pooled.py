"""Database work for the socket code, on three small thread pools of its own.

Not the one thread channels shares among every consumer by default: that thread
saturated under load. Nor the event loop's default pool (min(32, cores + 4) threads):
rendering is Python, so its threads only take turns at the GIL, and each one more of
them is one more the event loop waits behind for every callback it runs. Under
`make load` on 2 cores, with 6 pool threads rendering pushes, a socket's handshake took
0.3–2 s between its awaits alone, and some passed daphne's 5 s handshake timeout.

- `pooled`: pushes and the watch's probes, `ASSISTANT_PUSH_THREADS` threads (two: one
  renders while the other waits for the database).
- `busy_lane`: the busy panels (assistant/consumers.py `owe_busy`), one thread, paced to
  use at most `ASSISTANT_PANEL_CPU_SHARE` of a core (`Paced`). A page's rows and chat do
  not wait for them; with more busy pages than the share serves, each page's panels come
  less often, what it owes meanwhile joined into one render. Unpaced, under `make load`
  they were a third of daphne's CPU, which it took from the workers running the turns.
- `handshake`: what a connecting socket reads before it can accept, on two threads of its
  own, so a new page's socket does not queue behind the pushes of every open one.

Each call is self-contained (no transaction spans two); a socket reads in one task, so in
order. The call closes its connection itself (on PostgreSQL: gives it back to the
connection pool): DatabaseSyncToAsync does too, but channels' test communicator stubs that
out, and a pool thread would keep it open after the test.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor

from channels.db import DatabaseSyncToAsync
from django.conf import settings
from django.db import close_old_connections

# A pool starts no thread before its first task.
PUSHES = ThreadPoolExecutor(max_workers=settings.ASSISTANT_PUSH_THREADS, thread_name_prefix="socket-push")
HANDSHAKES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="socket-handshake")
BUSY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="socket-panels")


class Paced:
    """A one-thread lane's pace: each call starts no sooner than its predecessor's CPU
    time × (1 / share − 1) after that one ended, so the lane uses at most `share` of a
    core (the setting named `share_setting`, read at each call). The CPU is the thread's
    own: waiting for the GIL or the database costs no turn. Not thread-safe: one thread
    calls it."""

    def __init__(self, share_setting: str):
        self.share_setting = share_setting
        self.next_at = 0.0

    def __call__(self, func):
        @functools.wraps(func)
        def paced(*args, **kwargs):
            if (wait := self.next_at - time.monotonic()) > 0:
                time.sleep(wait)
            started = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                cpu = time.thread_time() - started
                self.next_at = time.monotonic() + cpu * (1 / getattr(settings, self.share_setting) - 1)

        return paced


def _on(pool: ThreadPoolExecutor, *, paced: Paced | None = None):
    def decorate(func):
        @functools.wraps(func)
        def closing(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            finally:
                close_old_connections()

        return DatabaseSyncToAsync(paced(closing) if paced else closing, thread_sensitive=False, executor=pool)

    return decorate


pooled = _on(PUSHES)
handshake = _on(HANDSHAKES)
busy_lane = _on(BUSY, paced=Paced("ASSISTANT_PANEL_CPU_SHARE"))
