"""Provider rate limits shared by every worker of a deployment (issue 26).

Real providers cap requests and tokens per minute per model and key, and answer 429 when a
key goes over. Every model call (engine/loop.py `_ask`, every role) asks this limiter
first, so that a burst of fan-out turns queues here, in order, instead of hitting the
provider together and retrying together.

- limits.py: what a deployment configured (ASSISTANT_PROVIDER_LIMITS), with defaults for
  OpenAI's own endpoint; checked at start.
- buckets.py: the accounting (token buckets, holds, the orchestrator's priority mark).
- stores.py: where it lives (Redis, PostgreSQL, or this process).
- limiter.py: the order of waiters in a process, and waiting as a coroutine.
- headers.py: what the provider's headers say (x-ratelimit-*, Retry-After).

`process_limiter(offload)` is this process's limiter; `offload` runs the database store's
short transactions off the event loop (the runner's database threads).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from orchestration.llm.capacity.headers import retry_after_seconds
from orchestration.llm.capacity.limiter import Endpoint, Grant, Limiter, Priority, Stopped
from orchestration.llm.capacity.limits import settings_checked
from orchestration.llm.capacity.stores import DatabaseStore, RedisStore

__all__ = ["Endpoint", "Grant", "Limiter", "Priority", "Stopped", "process_limiter", "retry_after_seconds",
           "store_for_deployment"]

_limiters: dict[tuple, Limiter] = {}


def store_for_deployment(offload):
    """Redis when REDIS_URL is set, else the database's table: on the embedded default
    too, since even one qcluster there is several worker processes (SQLite's IMMEDIATE
    transactions serialise the accounting; a model with no limit costs no write)."""
    if settings.REDIS_URL:
        return RedisStore(settings.REDIS_URL)
    return DatabaseStore(offload)


SDK_MOST_BACKOFF_SECONDS = 8.0  # the openai SDK's longest wait between two tries


def process_limiter(offload) -> Limiter | None:
    """This process's limiter (None: ASSISTANT_PROVIDER_LIMITER=0). Bad limit settings
    raise ImproperlyConfigured here, before any call is made."""
    if not settings.ASSISTANT_PROVIDER_LIMITER:
        return None
    settings_checked()
    # A call's slot lasts as long as the call can: its timeout for each of the SDK's tries,
    # the SDK's waits between them (8 s at most each), and a moment. A dead process's slot
    # frees no later than that.
    retries = settings.ASSISTANT_LLM_MAX_RETRIES
    ttl = settings.ASSISTANT_LLM_TIMEOUT_SECONDS * (retries + 1) + SDK_MOST_BACKOFF_SECONDS * retries + 2
    key = (settings.REDIS_URL, connection.vendor, settings.ASSISTANT_PROVIDER_CONCURRENCY, ttl)
    if key not in _limiters:
        _limiters[key] = Limiter(store_for_deployment(offload), concurrency=settings.ASSISTANT_PROVIDER_CONCURRENCY,
                                 grant_ttl=ttl)
    return _limiters[key]
