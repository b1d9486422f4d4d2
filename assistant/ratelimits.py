"""Requests per user in a sliding window: new conversations and messages (turn starts).

One account once made 1,000 conversations in 6 s and started 150 turns in 5.5 s. Each
kind of request has a limit per window (settings.ASSISTANT_RATE_LIMITS); past it the
request is refused with the time until the oldest request in the window ages out, which
the web layer answers as HTTP 429 with Retry-After.

Why not a cache-based limiter (django-ratelimit and the like): without Redis the cache is
per process, and even with it a count in the cache is a second source of truth beside the
rows. Here the count and the work share one database transaction, under a lock per user
and kind of request: two concurrent requests of one user queue on it, so the window can
never hold more than the limit, and a request that fails (a turn still running, an empty
message) rolls back its stamp with its work. Other users' requests take other locks and
never wait on these.

The lock is not the user's row. The work locks the conversation (turn_start), and a
skill's transaction locks its conversation and then the user's row (skills/egress.py,
one send at a time per owner): a request holding the user's row while it waited for the
conversation could deadlock with a mail being sent in it. On PostgreSQL it is an
advisory transaction lock that nothing else takes; on SQLite every write transaction is
IMMEDIATE (assistant/databases.py), so it holds the database's write lock from its start
and the count is serialised already.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from assistant.models import RequestStamp

CONVERSATION = "conversation"
MESSAGE = "message"
_WORDS = {CONVERSATION: ("started", "new conversation", "new conversations"), MESSAGE: ("sent", "message", "messages")}


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """How many requests of one kind a user may make in a sliding window."""

    action: str
    """What is counted: CONVERSATION or MESSAGE (RequestStamp.action)."""
    limit: int
    """Requests admitted per window; the next one is refused until the oldest ages out."""
    window_seconds: int
    """The window's length (settings.ASSISTANT_RATE_WINDOW_SECONDS, an hour by default)."""

    @classmethod
    def from_settings(cls, action: str) -> RateLimit:
        return cls(action=action, limit=settings.ASSISTANT_RATE_LIMITS[action],
                   window_seconds=settings.ASSISTANT_RATE_WINDOW_SECONDS)

    def refusal(self, retry_after: int) -> str:
        """What the user reads: what was too many, and when to try again."""
        window = "hour" if self.window_seconds == 3600 else duration_words(self.window_seconds)
        verb, one, many = _WORDS.get(self.action, ("made", self.action, self.action))
        return (f"You have {verb} {self.limit} {one if self.limit == 1 else many} in the last {window}, "
                f"the most allowed. Try again in {duration_words(retry_after)}.")


class RateLimited(Exception):
    """The user has used up a rate limit; `retry_after` seconds until the next request fits."""

    def __init__(self, limit: RateLimit, retry_after: int):
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(limit.refusal(retry_after))


@contextmanager
def rate_limited(*, user, action: str) -> Iterator[None]:
    """Admit one request of `action` by `user`, or raise RateLimited before the block runs.

    The block runs in the same transaction as the count, under the user's lock, and the
    request is stamped only if the block succeeds: an exception in it (a refused
    turn) rolls back its work and costs no allowance.

        with rate_limited(user=request.user, action=MESSAGE):
            turn_start(conversation=conversation, text=text)
    """
    limit = RateLimit.from_settings(action)
    with transaction.atomic():
        _serialise(user_id=user.pk, action=action)
        now = timezone.now()
        stamps = RequestStamp.objects.filter(user=user, action=action)
        stamps.filter(at__lte=now - timedelta(seconds=limit.window_seconds)).delete()
        in_window = list(stamps.order_by("at").values_list("at", flat=True)[: limit.limit])
        if len(in_window) >= limit.limit:
            ages_out = in_window[0] + timedelta(seconds=limit.window_seconds)
            raise RateLimited(limit, retry_after=max(1, math.ceil((ages_out - now).total_seconds())))
        yield
        RequestStamp.objects.create(user=user, action=action, at=now)


def _serialise(*, user_id: int, action: str) -> None:
    """Make this user's requests of this kind wait for each other until the transaction
    ends (see the module docstring for why not the user's row)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"ratelimit:{action}:{user_id}"])


def duration_words(seconds: int) -> str:
    """"1 hour", "25 minutes", "40 seconds": rounded up, since sooner would be refused."""
    if seconds >= 3600 and seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour{'s' if hours != 1 else ''}"
    if seconds > 90:
        minutes = math.ceil(seconds / 60)
        return f"{minutes} minutes"
    return f"{seconds} second{'s' if seconds != 1 else ''}"
