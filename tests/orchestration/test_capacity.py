"""The provider rate limiter (orchestration/llm/capacity/), with real stores.

Two "processes" are two store (or limiter) instances sharing one accounting: the same
dict in memory, the same table in the database, the same keys in Redis (when REDIS_URL is
set). The store cases run on a clock the test sets; the limiter cases in real time, with
small limits."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from orchestration.delivery import runner
from orchestration.llm import capacity
from orchestration.llm.capacity.buckets import URGENT_MARGIN_SECONDS
from orchestration.llm.capacity.headers import duration_seconds, observed, retry_after_seconds
from orchestration.llm.capacity.limiter import Endpoint, Limiter, Priority, Stopped, _Queue, _Waiter
from orchestration.llm.capacity.limits import Limits, limits_for
from orchestration.llm.capacity.stores import DatabaseStore, MemoryStore, RedisStore

ENDPOINT = "http://provider.test/v1#abc"
MODEL = "m"
T0 = 1_700_000_000.0
pytestmark = pytest.mark.django_db(transaction=True)
BACKENDS = ["memory", "database"] + (["redis"] if os.environ.get("REDIS_URL") else [])


@pytest.fixture(params=BACKENDS)
def two(request):
    """Two stores over one shared accounting, as two worker processes see it."""
    if request.param == "memory":
        shared = MemoryStore()
        yield shared, shared
    elif request.param == "database":
        yield DatabaseStore(runner.db), DatabaseStore(runner.db)
    else:
        prefix = f"test-capacity:{uuid.uuid4().hex}:"
        yield RedisStore(os.environ["REDIS_URL"], prefix=prefix), RedisStore(os.environ["REDIS_URL"], prefix=prefix)
        import redis

        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)


def take(store, now, conf, *, tokens=0, urgent=False, concurrency=0, grant="g", ttl=60.0):
    return store.acquire(ENDPOINT, MODEL, now=now, tokens=tokens, conf=conf, urgent=urgent,
                         concurrency=concurrency, grant_id=grant, expires=now + ttl)


async def test_two_processes_share_one_request_limit(two):
    a, b = two
    conf = Limits(rpm=60, burst_seconds=2)  # a request a second, two at once
    assert await take(a, T0, conf) == 0
    assert await take(b, T0, conf) == 0
    assert await take(a, T0, conf) == pytest.approx(1.0)
    assert await take(b, T0 + 0.5, conf) == pytest.approx(0.5)
    assert await take(b, T0 + 1.0, conf) == 0


async def test_tokens_are_reserved_then_settled_to_what_was_used(two):
    a, b = two
    conf = Limits(tpm=600, burst_seconds=60)  # 10 tokens a second, 600 at once
    assert await take(a, T0, conf, tokens=500, grant="big") == 0
    assert await take(b, T0, conf, tokens=200) == pytest.approx(10.0)  # 100 left, 200 wanted
    await a.settle(ENDPOINT, MODEL, now=T0, conf=conf, reserved=500, actual=100, grant_id="big")
    assert await take(b, T0, conf, tokens=200) == 0  # 400 came back


async def test_a_call_larger_than_the_bucket_still_goes_and_the_rate_holds(two):
    a, b = two
    conf = Limits(tpm=60, burst_seconds=1)  # one token a second, one at once
    assert await take(a, T0, conf, tokens=30) == 0  # the bucket goes 29 into debt
    assert await take(b, T0, conf, tokens=1) == pytest.approx(30.0)


async def test_a_hold_seen_by_one_process_holds_the_other(two):
    a, b = two
    conf = Limits()  # unlimited: only the provider's word stops a call
    await a.hold(ENDPOINT, MODEL, now=T0, conf=conf, until=T0 + 5)
    assert await take(b, T0, conf) == pytest.approx(5.0)
    assert await take(b, T0 + 5.01, conf) == 0


async def test_the_providers_headers_correct_the_configured_limit(two):
    a, b = two
    conf = Limits(rpm=6000)  # configured far too high
    headers = {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
               "x-ratelimit-reset-requests": "2s", "x-ratelimit-limit-tokens": "1000"}
    await a.observe(ENDPOINT, MODEL, now=T0, conf=conf, seen=observed(headers))
    assert await take(b, T0, conf) == pytest.approx(1.0)  # nothing remains: one request refills in 1 s
    assert await take(b, T0 + 2.5, conf, tokens=10) == 0
    assert await take(a, T0 + 2.5, conf) == pytest.approx(1.0)  # 60 a minute now, not 6000


async def test_nothing_remaining_waits_for_the_refill_not_the_reset(two):
    """x-ratelimit-reset-tokens is when the provider's bucket is full again: the next call
    goes when its own tokens have refilled (a limiter that admits calls as the bucket
    refills leaves it empty after most calls; holding every call until the reset stalled
    them all, the ratelimited bench admitting 53-82 % of the TPM)."""
    a, b = two
    conf = Limits(tpm=600, burst_seconds=2)  # 10 tokens a second, 20 at once
    headers = {"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "0",
               "x-ratelimit-reset-tokens": "2s"}
    await a.observe(ENDPOINT, MODEL, now=T0, conf=conf, seen=observed(headers))
    assert await take(b, T0, conf, tokens=5) == pytest.approx(0.5)
    assert await take(b, T0 + 0.5, conf, tokens=5) == 0


async def test_a_dead_holders_slot_expires(two):
    a, b = two
    conf = Limits()
    assert await take(a, T0, conf, concurrency=1, grant="dead", ttl=3) == 0  # never settled
    assert await take(b, T0 + 1, conf, concurrency=1, grant="live") > 0
    assert await take(b, T0 + 3.5, conf, concurrency=1, grant="live") == 0


async def test_a_renewed_slot_outlasts_its_ttl_and_a_settled_one_is_not_renewed(two):
    a, b = two
    conf = Limits()
    assert await take(a, T0, conf, concurrency=1, grant="long", ttl=3) == 0
    await a.renew(ENDPOINT, grant_id="long", expires=T0 + 6)  # the call is still on the wire at T0 + 3
    assert await take(b, T0 + 4, conf, concurrency=1, grant="next") > 0
    await a.settle(ENDPOINT, MODEL, now=T0 + 5, conf=conf, reserved=0, actual=0, grant_id="long", concurrency=1)
    await a.renew(ENDPOINT, grant_id="long", expires=T0 + 9)  # a renewal that lost the race to the settle
    assert await take(b, T0 + 5, conf, concurrency=1, grant="next") == 0


async def test_a_settled_call_frees_its_slot(two):
    a, b = two
    conf = Limits()
    assert await take(a, T0, conf, concurrency=1, grant="one") == 0
    assert await take(b, T0, conf, concurrency=1, grant="two") > 0
    await a.settle(ENDPOINT, MODEL, now=T0, conf=conf, reserved=0, actual=0, grant_id="one", concurrency=1)
    assert await take(b, T0, conf, concurrency=1, grant="two") == 0


async def test_an_orchestrator_waiting_in_one_process_goes_before_agents_in_another(two):
    a, b = two
    conf = Limits(rpm=60, burst_seconds=1)
    assert await take(a, T0, conf) == 0  # an agent takes the only request
    assert await take(b, T0, conf, urgent=True) == pytest.approx(1.0)  # the orchestrator must wait: marked
    assert await take(a, T0 + 1.0, conf) == pytest.approx(URGENT_MARGIN_SECONDS)  # agents give way
    assert await take(b, T0 + 1.0, conf, urgent=True) == 0
    assert await take(a, T0 + 2.0, conf) == 0  # the mark is gone with the orchestrator's call


# --- the limiter: order, waiting, stopping --------------------------------------------------------

ENDPOINT_OF = Endpoint.of("http://provider.test/v1", "sk-secret")


def fast_limiter(store=None, **kw) -> Limiter:
    """Ten requests a second, one at once."""
    return Limiter(store or MemoryStore(), limits=lambda base_url, model: Limits(rpm=600, burst_seconds=0.1), **kw)


def test_the_endpoint_names_the_key_by_a_hash_only():
    assert "sk-secret" not in str(ENDPOINT_OF)
    assert str(ENDPOINT_OF).startswith("http://provider.test/v1#")
    assert Endpoint.of("http://provider.test/v1", "other") != ENDPOINT_OF


async def test_one_users_twenty_agents_do_not_delay_anothers_question():
    limiter, order = fast_limiter(), []

    async def call(name, priority):
        grant = await limiter.acquire(ENDPOINT_OF, MODEL, tokens=0, priority=priority)
        order.append(name)
        await grant.settle(0)

    burst = [asyncio.create_task(call(f"alice-{i}", Priority(orchestrator=False, user=1, depth=1)))
             for i in range(20)]
    await asyncio.sleep(0.05)  # alice's burst is queued first
    others = [asyncio.create_task(call("bob-question", Priority(orchestrator=True, user=2))),
              asyncio.create_task(call("carol-agent", Priority(orchestrator=False, user=3, depth=1)))]
    await asyncio.gather(*burst, *others)
    assert order.index("bob-question") <= 3, order
    assert order.index("carol-agent") <= 4, order


def test_fair_order_in_a_process():
    queue = _Queue()
    child = _Waiter(Priority(orchestrator=False, user=1, depth=2), seq=0)
    parent = _Waiter(Priority(orchestrator=False, user=1, depth=1), seq=1)
    question = _Waiter(Priority(orchestrator=True, user=1, depth=0), seq=2)
    for waiter in (child, parent):
        queue.add(waiter)
    assert queue.head() is parent  # a nested agent never before its parent's generation
    queue.add(question)
    assert queue.head() is question
    queue.admitted(question)
    queue.remove(question)
    queue.admitted(parent)
    queue.remove(parent)
    late = _Waiter(Priority(orchestrator=False, user=2, depth=2), seq=3)
    queue.add(late)
    assert queue.head() is late  # user 2 has had no turn; user 1 has had two


def test_a_users_single_question_goes_before_twenty_users_bursts():
    """Twenty users, four agent calls each waiting, served in rounds for a while; then one
    more user asks (its orchestrator call, later its one agent's): each goes next, not
    after a round of the twenty (issue 26: within a few calls, not twenty)."""
    queue, seq = _Queue(), iter(range(10_000))
    for user in range(20):
        for _ in range(4):
            queue.add(_Waiter(Priority(orchestrator=False, user=user, depth=1), seq=next(seq)))
    for _ in range(30):  # a round and a half: every user has been served once or twice
        head = queue.head()
        queue.admitted(head)
        queue.remove(head)
        queue.add(_Waiter(head.priority, seq=next(seq)))  # the agent's next call
    burst_orchestrator = _Waiter(Priority(orchestrator=True, user=0, depth=0), seq=next(seq))
    queue.add(burst_orchestrator)
    question = _Waiter(Priority(orchestrator=True, user=99, depth=0), seq=next(seq))
    queue.add(question)
    assert queue.head() is question  # user 0 has four calls waiting, user 99 one
    queue.admitted(question)
    queue.remove(question)
    queue.admitted(burst_orchestrator)
    queue.remove(burst_orchestrator)
    agent = _Waiter(Priority(orchestrator=False, user=99, depth=1), seq=next(seq))
    queue.add(agent)
    assert queue.head() is agent


async def test_a_hold_from_one_limiter_makes_the_other_wait():
    store = MemoryStore()
    first, second = fast_limiter(store), fast_limiter(store)
    await first.hold(ENDPOINT_OF, MODEL, time.time() + 0.6)
    grant = await second.acquire(ENDPOINT_OF, MODEL, tokens=0, priority=Priority(orchestrator=True))
    assert grant.waited >= 0.5


async def test_stop_while_waiting_ends_the_wait():
    limiter = fast_limiter(check_seconds=0.1)
    await limiter.hold(ENDPOINT_OF, MODEL, time.time() + 30)
    stopped_at = time.monotonic() + 0.3

    async def check():
        return "stopped" if time.monotonic() >= stopped_at else None

    started = time.monotonic()
    with pytest.raises(Stopped) as caught:
        await limiter.acquire(ENDPOINT_OF, MODEL, tokens=0, priority=Priority(orchestrator=False), check=check)
    assert caught.value.value == "stopped"
    assert time.monotonic() - started < 2


async def test_a_call_that_outlasts_its_slots_ttl_keeps_the_slot_while_it_runs():
    """A stream's timeout is per chunk: a call can run past the slot's time-to-live, and
    the only slot must stay its own until it ends (a lapsed slot let a second call out
    beside it). Once it ends, the next call goes."""
    store = MemoryStore()
    first, second = (Limiter(store, concurrency=1, grant_ttl=0.3) for _ in range(2))
    grant = await first.acquire(ENDPOINT_OF, MODEL, tokens=0, priority=Priority(orchestrator=False))
    ended = []

    async def long_call():
        async with grant.kept():
            await asyncio.sleep(1.0)  # three times the ttl
        ended.append(time.monotonic())
        await grant.settle(0)

    call = asyncio.create_task(long_call())
    other = await second.acquire(ENDPOINT_OF, MODEL, tokens=0, priority=Priority(orchestrator=False))
    admitted = time.monotonic()
    await call
    assert ended and admitted >= ended[0], "a second call was admitted while the first was still running"
    await other.settle(0)


async def test_a_store_that_is_down_lets_calls_through():
    class Down(MemoryStore):
        async def acquire(self, *args, **kw):
            raise ConnectionError("no store")

    grant = await fast_limiter(Down()).acquire(ENDPOINT_OF, MODEL, tokens=0, priority=Priority(orchestrator=True))
    await grant.settle(10)  # nothing to settle, nothing raised


# --- settings and headers ---------------------------------------------------------------------------

@pytest.mark.parametrize("table", [
    {"m": {"rpm": -1}}, {"m": {"rpm": "fast"}}, {"m": {"tpm": 1.5}}, {"m": {"rpm": 1, "rps": 2}},
    {"m": {"burst_seconds": 0}}, {"m": 500}, ["m"],
])
def test_bad_limits_are_refused_at_start(settings, table):
    settings.ASSISTANT_PROVIDER_LIMITS = table
    assert "orchestration.E002" in {problem.id for problem in run_checks()}
    with pytest.raises(ImproperlyConfigured):
        capacity.process_limiter(runner.db)


def test_a_bad_concurrency_is_refused(settings):
    settings.ASSISTANT_PROVIDER_CONCURRENCY = -2
    assert "orchestration.E002" in {problem.id for problem in run_checks()}


def test_good_limits_pass(settings):
    settings.ASSISTANT_PROVIDER_LIMITS = {"m": {"rpm": 500, "tpm": 200000, "burst_seconds": 2}, "*": {"rpm": 60}}
    assert "orchestration.E002" not in {problem.id for problem in run_checks()}


def test_configured_limits_and_openai_defaults(settings):
    settings.ASSISTANT_PROVIDER_LIMITS = {"mine": {"rpm": 5}, "*": {"tpm": 1000}}
    assert limits_for("http://vllm.local/v1", "mine") == Limits(rpm=5)
    assert limits_for("http://vllm.local/v1", "other") == Limits(tpm=1000)
    assert limits_for("http://vllm.local/v1", "gpt-4o-mini") == Limits(tpm=1000)  # no defaults off OpenAI
    assert limits_for(None, "gpt-4o-mini-2024-07-18") == Limits(rpm=500, tpm=200_000)
    settings.ASSISTANT_PROVIDER_LIMITS = {}
    assert limits_for("http://vllm.local/v1", "anything") == Limits()  # unlimited until the headers say


def test_header_durations_and_retry_after():
    assert duration_seconds("6m0s") == 360
    assert duration_seconds("20ms") == pytest.approx(0.02)
    assert duration_seconds("1h2m3.5s") == pytest.approx(3723.5)
    assert duration_seconds("soon") is None
    assert retry_after_seconds({"Retry-After": "2"}) == 2
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1.5s"}) == 1.5
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize("backend", ["database", "redis"])
async def test_an_unlimited_model_costs_no_write_and_still_sees_another_process_hold(backend, monkeypatch):
    """Either store reads an unmetered model's state at most every 0.1 s per process: a
    call costs no lock, no script and no write, and a 429 hold another process records
    reaches this one within that time."""
    from asgiref.sync import sync_to_async

    from orchestration.llm.capacity import stores
    from orchestration.models import ProviderCapacity

    if backend == "redis" and not os.environ.get("REDIS_URL"):
        pytest.skip("needs Redis (set REDIS_URL)")
    reads, scripts = [], []
    if backend == "database":
        state = DatabaseStore._state
        monkeypatch.setattr(DatabaseStore, "_state", staticmethod(lambda key: reads.append(key) or state(key)))
        a, b = DatabaseStore(runner.db), DatabaseStore(runner.db)
    else:
        prefix = f"test-capacity:{uuid.uuid4().hex}:"
        a, b = RedisStore(os.environ["REDIS_URL"], prefix=prefix), RedisStore(os.environ["REDIS_URL"], prefix=prefix)
        read, run = RedisStore._state_read, RedisStore._run
        monkeypatch.setattr(RedisStore, "_state_read", lambda self, key: reads.append(key) or read(self, key))
        monkeypatch.setattr(RedisStore, "_run", lambda self, *args: scripts.append(args[2]) or run(self, *args))
    conf = Limits()  # nothing configured, nothing stated
    assert await take(a, T0, conf, grant="g1") == 0
    assert await take(a, T0 + 0.05, conf, grant="g2") == 0
    await a.settle(ENDPOINT, MODEL, now=T0 + 0.06, conf=conf, reserved=0, actual=10, grant_id="g1")
    assert len(reads) == 1 and not scripts  # one read, no script
    assert not await sync_to_async(ProviderCapacity.objects.exists)()  # and no row
    await b.hold(ENDPOINT, MODEL, now=T0 + 0.07, conf=conf, until=T0 + 30)
    assert await take(a, T0 + 0.08, conf, grant="g3") == 0  # still within the moment it trusts
    assert await take(a, T0 + stores.UNMETERED_SECONDS + 0.1, conf, grant="g4") > 0  # then it reads the hold
    assert len(reads) == 2
