"""Database work for the socket code, on the event loop's thread pool."""

from __future__ import annotations

import functools

from channels.db import DatabaseSyncToAsync
from django.db import close_old_connections


def pooled(func):
    """Database work on the loop's thread pool (`thread_sensitive=False`), not on the one
    thread every consumer shares: that thread saturated under load, and new sockets'
    handshakes queued behind other sockets' pushes past daphne's 5 s handshake timeout.
    Each call is self-contained (no transaction spans two); a socket reads in one task,
    so in order. The call closes its connection itself (with CONN_MAX_AGE = 0):
    DatabaseSyncToAsync does too, but channels' test communicator stubs that out, and a
    pool thread would keep it open after the test."""

    @functools.wraps(func)
    def closing(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return DatabaseSyncToAsync(closing, thread_sensitive=False)
