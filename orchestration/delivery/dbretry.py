"""Which database errors are worth another try, and trying again on a fresh connection.

A server restarting, a connection cut, a serialization failure or a deadlock say
nothing about the work: the same transaction, begun again a moment later on a new
connection, succeeds. Anything else (a constraint, a bug) would fail the same way again
and is raised at once. Only whole transactions are retried, so nothing half-written
is ever written twice.
"""

from __future__ import annotations

import asyncio
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

# SQLSTATE classes and codes that mean "try again": connection exceptions (08), a
# transaction rolled back by the server (40: serialization failure, deadlock), the
# server shutting down or starting (57P01-57P03), too many connections (53300).
TRANSIENT_CLASSES = ("08", "40")
TRANSIENT_CODES = ("57P01", "57P02", "57P03", "53300")
FIRST_WAIT_SECONDS, MOST_WAIT_SECONDS = 0.1, 2.0


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if sqlstate:
        return sqlstate[:2] in TRANSIENT_CLASSES or sqlstate in TRANSIENT_CODES
    if connection.vendor == "sqlite":
        return "locked" in str(exc) or "busy" in str(exc)
    return True  # no SQLSTATE: the connection itself failed (closed, refused, lost)


def rolled_back_by_server(exc: BaseException) -> bool:
    """A deadlock or serialization failure: the server rolled the transaction back, and
    the same transaction begun again (from a savepoint too) can succeed."""
    return isinstance(exc, OperationalError) and (getattr(exc.__cause__, "sqlstate", None) or "")[:2] == "40"


def fresh_connection() -> None:
    """Drop this thread's connection if an error left it unusable; the next query opens
    a new one (what Django does between requests)."""
    if connection.errors_occurred and not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


class Retrying:
    """The waits of one operation's retries, up to ASSISTANT_DB_RETRY_SECONDS in all."""

    def __init__(self):
        self.deadline = time.monotonic() + settings.ASSISTANT_DB_RETRY_SECONDS
        self.wait = FIRST_WAIT_SECONDS

    def may_retry(self, exc: BaseException) -> bool:
        return is_transient(exc) and time.monotonic() + self.wait < self.deadline

    async def pause(self) -> None:
        await asyncio.sleep(self.wait)
        self.wait = min(self.wait * 2, MOST_WAIT_SECONDS)
