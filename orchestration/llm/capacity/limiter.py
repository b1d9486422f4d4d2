"""One process's door to the shared accounting: who asks next, and waiting cheaply.

A call asks `acquire` for one request and its estimated tokens; it gets a Grant when the
store (stores.py) admits it, and settles the grant with the tokens the provider reported.

Who goes first. In a process, the waiters of one (endpoint, model) form a queue and only
its head asks the store; the head is the first by
  (orchestrator before sub-agent, the user's calls waiting here, the user's share so
  far, depth, arrival):
the user's question first; then the user with the fewest calls waiting, so one user's
single question goes before the next call of users whose many agents wait (a round-robin
alone gave it one call in a round of every busy user: twenty users' bursts made it wait
twenty calls each time); among users with as many waiting, a round-robin (each user's
count of admitted calls, a user who starts waiting starting at the count of the last call
admitted); and a nested agent never before its parent's generation. Across processes the guarantee is weaker: an
orchestrator that is refused marks the store `urgent`, and every process's sub-agent
calls then wait until it went (or the mark lapses, half a second after its expected
turn); fairness between users holds within each process, and processes compete as
equals for the shared buckets.

Waiting costs a coroutine. The head sleeps until the store says capacity will be there
(or a slot may have freed); the others sleep until they become the head. No thread and
no database connection is held between looks. Every `check_seconds` each waiter calls
`check` (the role's: its turn stopped, paused, or this process ending); a value other
than None ends the wait with Stopped(value).

If the store cannot be reached (Redis or the database down) a call goes ahead unlimited,
with a warning: the provider's 429s, then, still hold the others (hold()).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
import uuid
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from orchestration.llm.capacity.headers import observed
from orchestration.llm.capacity.limits import Limits, limits_for

logger = logging.getLogger(__name__)

CHECK_SECONDS = 1.0
MIN_SLEEP_SECONDS = 0.005


@dataclass(frozen=True)
class Endpoint:
    """A provider endpoint: its base URL and a short hash of the key (never the key)."""

    base_url: str
    key_hash: str

    @classmethod
    def of(cls, base_url: str | None, api_key: str | None) -> Endpoint:
        digest = hashlib.sha256((api_key or "").encode()).hexdigest()[:12]
        return cls(base_url=(base_url or "https://api.openai.com/v1").rstrip("/"), key_hash=digest)

    def __str__(self) -> str:
        return f"{self.base_url}#{self.key_hash}"


@dataclass(frozen=True)
class Priority:
    orchestrator: bool
    user: int | None = None
    depth: int = 0  # 0: the orchestrator; 1: its agents; 2: theirs


class Stopped(Exception):
    """The wait ended because `check` said so; `value` is what it returned."""

    def __init__(self, value):
        super().__init__(str(value))
        self.value = value


@dataclass
class Grant:
    """One admitted call. `waited`: seconds it waited for capacity."""

    limiter: Limiter | None
    endpoint: Endpoint
    model: str
    tokens: int
    grant_id: str
    conf: Limits
    waited: float = 0.0
    settled: bool = False

    @asynccontextmanager
    async def kept(self):
        """The call's slot is kept while it runs: past a third of its time-to-live, and every
        third after, it is renewed. The time-to-live bounds how long a dead process holds a
        slot; a live call may outlast it (a stream's timeout is per chunk, and a wait for a
        database thread comes before the request), and its slot must not lapse under it, or
        a second call goes out beside it under a concurrency of one."""
        limiter = self.limiter
        if limiter is None or not limiter.concurrency:
            yield
            return
        keeper = asyncio.create_task(limiter._keep(self))
        try:
            yield
        finally:
            keeper.cancel()

    async def settle(self, actual_tokens: int) -> None:
        """The call is over; it used `actual_tokens` (0: it was refused, or made no call)."""
        if self.settled or self.limiter is None:
            return
        self.settled = True
        await self.limiter._settle(self, actual_tokens)


@dataclass(eq=False)
class _Waiter:
    priority: Priority
    seq: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class _Queue:
    """A process's waiters for one (endpoint, model), in the order they may go."""

    def __init__(self):
        self.waiters: list[_Waiter] = []
        self.waiting: dict[int | None, int] = defaultdict(int)  # user → its calls waiting here
        self.served: dict[int | None, int] = defaultdict(int)
        self.vtime = 0

    def order(self, waiter: _Waiter) -> tuple:
        p = waiter.priority
        return (0 if p.orchestrator else 1, self.waiting[p.user], self.served[p.user], p.depth, waiter.seq)

    def head(self) -> _Waiter | None:
        return min(self.waiters, key=self.order, default=None)

    def add(self, waiter: _Waiter) -> None:
        user = waiter.priority.user
        if not self.waiting[user]:
            self.served[user] = max(self.served[user], self.vtime)
        self.waiting[user] += 1
        self.waiters.append(waiter)

    def admitted(self, waiter: _Waiter) -> None:
        user = waiter.priority.user
        self.vtime = self.served[user]
        self.served[user] += 1

    def remove(self, waiter: _Waiter) -> None:
        self.waiters.remove(waiter)
        user = waiter.priority.user
        self.waiting[user] -= 1
        if not self.waiting[user]:
            del self.waiting[user]
        if not self.waiters:
            self.served.clear()
            self.vtime = 0
        elif (head := self.head()) is not None:
            head.wake.set()


class Limiter:
    def __init__(self, store, *, concurrency: int = 0, grant_ttl: float = 300.0, clock: Callable[[], float] = time.time,
                 check_seconds: float = CHECK_SECONDS, limits: Callable[[str | None, str], Limits] = limits_for):
        self.store = store
        self.concurrency = concurrency
        self.grant_ttl = grant_ttl
        self.clock = clock
        self.check_seconds = check_seconds
        self.limits = limits
        self._queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop → {key: _Queue}
        self._seq = itertools.count()

    def _conf(self, endpoint: Endpoint, model: str) -> Limits:
        return self.limits(endpoint.base_url, model)

    def _queue(self, endpoint: Endpoint, model: str) -> _Queue:
        queues = self._queues.setdefault(asyncio.get_running_loop(), {})
        return queues.setdefault((str(endpoint), model), _Queue())

    async def acquire(self, endpoint: Endpoint, model: str, *, tokens: int, priority: Priority,
                      check: Callable[[], Awaitable[object]] | None = None) -> Grant:
        """Wait for one request and `tokens` of `model` on `endpoint`, in turn (see above)."""
        conf = self._conf(endpoint, model)
        grant = Grant(self, endpoint, model, tokens, uuid.uuid4().hex, conf)
        queue, waiter = self._queue(endpoint, model), _Waiter(priority, next(self._seq))
        started = time.monotonic()
        next_check = started + self.check_seconds
        queue.add(waiter)
        try:
            while True:
                if queue.head() is waiter:
                    wait = await self._try(grant, priority)
                    if wait <= 0:
                        queue.admitted(waiter)
                        break
                else:
                    wait = self.check_seconds
                waiter.wake.clear()
                timeout = max(MIN_SLEEP_SECONDS, min(wait, next_check - time.monotonic()))
                try:
                    await asyncio.wait_for(waiter.wake.wait(), timeout)
                except TimeoutError:
                    pass
                if check is not None and time.monotonic() >= next_check:
                    if (stop := await check()) is not None:
                        raise Stopped(stop)
                    next_check = time.monotonic() + self.check_seconds
        finally:
            queue.remove(waiter)
        grant.waited = time.monotonic() - started
        return grant

    async def _try(self, grant: Grant, priority: Priority) -> float:
        now = self.clock()
        try:
            return await self.store.acquire(str(grant.endpoint), grant.model, now=now, tokens=grant.tokens,
                                            conf=grant.conf, urgent=priority.orchestrator,
                                            concurrency=self.concurrency, grant_id=grant.grant_id,
                                            expires=now + self.grant_ttl)
        except Exception as exc:  # the store is down: go ahead rather than stop every call
            logger.warning("Provider limiter: the store is unavailable (%s); the call goes ahead unlimited", exc)
            grant.limiter = None
            return 0.0

    async def _keep(self, grant: Grant) -> None:
        every = self.grant_ttl / 3
        while True:
            await asyncio.sleep(every)
            try:
                await self.store.renew(str(grant.endpoint), grant_id=grant.grant_id,
                                       expires=self.clock() + self.grant_ttl)
            except Exception as exc:
                logger.warning("Provider limiter: could not renew a call's slot (%s)", exc)

    async def _settle(self, grant: Grant, actual: int) -> None:
        try:
            await self.store.settle(str(grant.endpoint), grant.model, now=self.clock(), conf=grant.conf,
                                    reserved=grant.tokens, actual=actual, grant_id=grant.grant_id,
                                    concurrency=self.concurrency)
        except Exception as exc:
            logger.warning("Provider limiter: could not settle a call (%s); its slot expires on its own", exc)

    async def hold(self, endpoint: Endpoint, model: str, until: float) -> None:
        """No call to `model` on `endpoint` from any process before `until` (epoch seconds):
        a 429 said so."""
        try:
            await self.store.hold(str(endpoint), model, now=self.clock(), conf=self._conf(endpoint, model),
                                  until=until)
        except Exception as exc:
            logger.warning("Provider limiter: could not record a hold (%s)", exc)

    async def observe(self, endpoint: Endpoint, model: str, headers: Mapping[str, str]) -> None:
        """Correct the accounting with what the provider's x-ratelimit-* headers say."""
        seen = observed(headers)
        if seen.is_empty():
            return
        try:
            await self.store.observe(str(endpoint), model, now=self.clock(), conf=self._conf(endpoint, model),
                                     seen=seen)
        except Exception as exc:
            logger.warning("Provider limiter: could not read the provider's headers in (%s)", exc)
