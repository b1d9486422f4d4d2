"""Where the accounting lives, shared by every process of a deployment that can see it.

- RedisStore (REDIS_URL set): one hash per (endpoint, model) and one sorted set of the
  calls in flight per endpoint, changed atomically by one Lua script (the steps of
  buckets.py); keys expire after a day unused.
- DatabaseStore (no Redis: PostgreSQL, or the embedded SQLite): one ProviderCapacity row per (endpoint,
  model), and one per endpoint for its calls in flight, locked (SELECT ... FOR UPDATE, in
  key order) for one short transaction; run off the event loop by `offload` (the
  runner's database threads), so a waiter holds no connection between its looks.
- MemoryStore: one process's accounting, a dict under a lock (tests, and any caller that
  needs no sharing).

In Redis and the database alike, a model with no limit (none configured or stated, no
hold) costs a call no write: its state is read at most every UNMETERED_SECONDS per process.

Each method takes the caller's clock reading (`now`, seconds since the epoch): every
machine of a deployment is expected to keep NTP time, as the leases already do.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from django.db import transaction

from orchestration.llm.base import pools_connections
from orchestration.llm.capacity import buckets
from orchestration.llm.capacity.buckets import Observed
from orchestration.llm.capacity.limits import Limits

Offload = Callable[..., Awaitable]


def endpoint_key(endpoint: str) -> str:
    return f"{endpoint}|"


def model_key(endpoint: str, model: str) -> str:
    return f"{endpoint}|{model}"


class _DictStore:
    """The steps of buckets.py on states read and written by a subclass, in one go."""

    def _acquire(self, states: dict, key: str, endpoint: str, *, now, tokens, conf, urgent, concurrency, grant_id,
                 expires) -> float:
        inflight = states[endpoint_key(endpoint)].setdefault("inflight", {}) if concurrency else None
        return buckets.acquire(states[key], now, tokens=tokens, conf=conf, urgent=urgent, inflight=inflight,
                               concurrency=concurrency, grant_id=grant_id, expires=expires)

    def _settle(self, states: dict, key: str, endpoint: str, *, now, conf, reserved, actual, grant_id,
                concurrency=0) -> None:
        buckets.settle(states[key], now, conf=conf, reserved=reserved, actual=actual)
        states[endpoint_key(endpoint)].get("inflight", {}).pop(grant_id, None)

    @staticmethod
    def _renew(states: dict, endpoint: str, *, grant_id: str, expires: float) -> None:
        buckets.renew(states[endpoint_key(endpoint)].get("inflight", {}), grant_id, expires)


class MemoryStore(_DictStore):
    """One process's accounting (the embedded default)."""

    def __init__(self):
        self._states: dict[str, dict] = {}
        self._lock = threading.Lock()

    def _all(self, *keys):
        return {key: self._states.setdefault(key, {}) for key in keys}

    async def acquire(self, endpoint: str, model: str, **kw) -> float:
        key = model_key(endpoint, model)
        with self._lock:
            return self._acquire(self._all(key, endpoint_key(endpoint)), key, endpoint, **kw)

    async def settle(self, endpoint: str, model: str, **kw) -> None:
        key = model_key(endpoint, model)
        with self._lock:
            self._settle(self._all(key, endpoint_key(endpoint)), key, endpoint, **kw)

    async def renew(self, endpoint: str, *, grant_id: str, expires: float) -> None:
        with self._lock:
            self._renew(self._all(endpoint_key(endpoint)), endpoint, grant_id=grant_id, expires=expires)

    async def hold(self, endpoint: str, model: str, *, now: float, conf: Limits, until: float) -> None:
        key = model_key(endpoint, model)
        with self._lock:
            buckets.hold(self._all(key)[key], until)

    async def observe(self, endpoint: str, model: str, *, now: float, conf: Limits, seen: Observed) -> None:
        key = model_key(endpoint, model)
        with self._lock:
            buckets.observe(self._all(key)[key], now, conf=conf, seen=seen)


# How long a process trusts that a model without limits has none (no 429 hold, no limit
# stated in another process's headers) before it reads its state again.
UNMETERED_SECONDS = 0.1


class _TrustsUnmetered:
    """A model with no limit (none configured, none stated by the provider, no hold)
    costs a call no write and no settling: its state is read, without a lock, at most
    once every UNMETERED_SECONDS per process, so a hold or a limit another process
    learned still reaches this one within that time. Every metered call is accounted
    exactly. A subclass reads the state (`_state_read`)."""

    def __init__(self):
        self._open_until: dict[str, float] = {}  # key → until when it is known unmetered
        self._unmetered: set[str] = set()  # grants that took nothing, so settle nothing

    async def _state_read(self, key: str) -> dict:
        raise NotImplementedError

    async def _goes_unmetered(self, key: str, *, now: float, conf: Limits, concurrency: int, grant_id: str) -> bool:
        """Whether this call goes without the accounting (and then its settle too)."""
        if concurrency or conf.rpm or conf.tpm:
            return False
        if self._open_until.get(key, 0.0) <= now:
            if not buckets.unmetered(await self._state_read(key), now, conf):
                self._open_until.pop(key, None)
                return False
            self._open_until[key] = now + UNMETERED_SECONDS
        self._unmetered.add(grant_id)
        return True

    def _settled_unmetered(self, grant_id: str) -> bool:
        if grant_id not in self._unmetered:
            return False
        self._unmetered.discard(grant_id)
        return True

    def _changed(self, key: str) -> None:
        """This process changed the key's state (a hold, a stated limit): read it again."""
        self._open_until.pop(key, None)


class DatabaseStore(_TrustsUnmetered, _DictStore):
    """Rows of ProviderCapacity, locked for one short transaction each time; a model with
    no limit costs a call no transaction (`_TrustsUnmetered`)."""

    def __init__(self, offload: Offload):
        super().__init__()
        self.offload = offload

    @staticmethod
    def _state(key: str) -> dict:
        from orchestration.models import ProviderCapacity

        return ProviderCapacity.objects.filter(key=key).values_list("state", flat=True).first() or {}

    async def _state_read(self, key: str) -> dict:
        return await self.offload(self._state, key)

    @staticmethod
    def _locked(*keys: str) -> dict[str, dict]:
        from orchestration.models import ProviderCapacity

        wanted = sorted(set(keys))
        rows = list(ProviderCapacity.objects.select_for_update().filter(key__in=wanted).order_by("key"))
        if len(rows) < len(wanted):
            ProviderCapacity.objects.bulk_create([ProviderCapacity(key=key, state={}) for key in wanted],
                                                 ignore_conflicts=True)
            rows = list(ProviderCapacity.objects.select_for_update().filter(key__in=wanted).order_by("key"))
        return {row.key: row.state for row in rows}

    @staticmethod
    def _save(states: dict[str, dict]) -> None:
        from orchestration.models import ProviderCapacity

        for key, state in states.items():
            ProviderCapacity.objects.filter(key=key).update(state=state)

    def _in_transaction(self, fn, *keys):
        with transaction.atomic():
            states = self._locked(*keys)
            result = fn(states)
            self._save(states)
            return result

    async def acquire(self, endpoint: str, model: str, *, concurrency: int, **kw) -> float:
        key = model_key(endpoint, model)
        if await self._goes_unmetered(key, now=kw["now"], conf=kw["conf"], concurrency=concurrency,
                                      grant_id=kw["grant_id"]):
            return 0.0
        keys = (key, endpoint_key(endpoint)) if concurrency else (key,)

        def take(states):
            states.setdefault(endpoint_key(endpoint), {})
            return self._acquire(states, key, endpoint, concurrency=concurrency, **kw)

        return await self.offload(self._in_transaction, take, *keys)

    async def settle(self, endpoint: str, model: str, *, concurrency: int = 0, **kw) -> None:
        if self._settled_unmetered(kw["grant_id"]):
            return
        key = model_key(endpoint, model)
        keys = (key, endpoint_key(endpoint)) if concurrency else (key,)

        def give(states):
            states.setdefault(endpoint_key(endpoint), {})
            self._settle(states, key, endpoint, **kw)

        await self.offload(self._in_transaction, give, *keys)

    async def renew(self, endpoint: str, *, grant_id: str, expires: float) -> None:
        def keep(states):
            self._renew(states, endpoint, grant_id=grant_id, expires=expires)

        await self.offload(self._in_transaction, keep, endpoint_key(endpoint))

    async def hold(self, endpoint: str, model: str, *, now: float, conf: Limits, until: float) -> None:
        key = model_key(endpoint, model)
        self._changed(key)
        await self.offload(self._in_transaction, lambda states: buckets.hold(states[key], until), key)

    async def observe(self, endpoint: str, model: str, *, now: float, conf: Limits, seen: Observed) -> None:
        key = model_key(endpoint, model)
        self._changed(key)
        await self.offload(self._in_transaction,
                           lambda states: buckets.observe(states[key], now, conf=conf, seen=seen), key)


# The steps of buckets.py, in Lua. KEYS[1]: the (endpoint, model) hash; KEYS[2]: the
# endpoint's calls in flight (a sorted set: grant id → expires). ARGV[1]: the operation.
_SCRIPT = """
local op = ARGV[1]
local now = tonumber(ARGV[2])
local conf_rpm, conf_tpm, burst = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local s = redis.call('HMGET', KEYS[1], 'r', 't', 'u', 'rpm', 'tpm', 'held', 'urgent')
local function num(v, d) if v == false or v == nil or v == '' then return d end return tonumber(v) end
local r, t, u = s[1], s[2], num(s[3], now)
local rpm, tpm = num(s[4], 0), num(s[5], 0)
local held, urgent = num(s[6], 0), num(s[7], 0)
local function refill()
  if rpm == 0 then rpm = conf_rpm end
  if tpm == 0 then tpm = conf_tpm end
  local elapsed = math.max(0, now - u)
  local cap_r, cap_t = 0, 0
  if rpm > 0 then cap_r = math.max(1, rpm * burst / 60); r = math.min(cap_r, num(r, cap_r) + elapsed * rpm / 60) else r = 0 end
  if tpm > 0 then cap_t = math.max(1, tpm * burst / 60); t = math.min(cap_t, num(t, cap_t) + elapsed * tpm / 60) else t = 0 end
  u = now
  return cap_t
end
local function save()
  redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(t), 'u', tostring(u), 'held', tostring(held),
             'urgent', tostring(urgent))
  redis.call('EXPIRE', KEYS[1], 86400)
end
if op == 'acquire' then
  local tokens, is_urgent, concurrency = tonumber(ARGV[6]), ARGV[7] == '1', tonumber(ARGV[8])
  local grant, expires = ARGV[9], tonumber(ARGV[10])
  local cap_t = refill()
  local wait = 0
  if held > now then
    wait = held - now
  elseif (not is_urgent) and urgent > now then
    wait = urgent - now
  else
    if concurrency > 0 then
      redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
      if redis.call('ZCARD', KEYS[2]) >= concurrency then wait = tonumber(ARGV[11]) end
    end
    if wait == 0 then
      if rpm > 0 and r < 1 then wait = (1 - r) * 60 / rpm end
      local need = math.min(tokens, cap_t)
      if tpm > 0 and t < need then wait = math.max(wait, (need - t) * 60 / tpm) end
    end
  end
  if wait > 0 then
    if is_urgent then urgent = math.max(urgent, now + wait + tonumber(ARGV[12])) end
    save()
    return tostring(wait)
  end
  if rpm > 0 then r = r - 1 end
  if tpm > 0 then t = t - tokens end
  if is_urgent then urgent = 0 end
  if concurrency > 0 then
    redis.call('ZADD', KEYS[2], expires, grant)
    redis.call('EXPIRE', KEYS[2], 86400)
  end
  save()
  return '0'
elseif op == 'settle' then
  local cap_t = refill()
  if tpm > 0 then t = math.min(cap_t, t + tonumber(ARGV[6]) - tonumber(ARGV[7])) end
  redis.call('ZREM', KEYS[2], ARGV[8])
  save()
elseif op == 'hold' then
  refill()
  held = math.max(held, tonumber(ARGV[6]))
  save()
elseif op == 'observe' then
  local seen = cjson.decode(ARGV[6])
  if seen.limit_requests ~= nil and seen.limit_requests ~= cjson.null and seen.limit_requests > 0 then
    rpm = seen.limit_requests; redis.call('HSET', KEYS[1], 'rpm', tostring(rpm)) end
  if seen.limit_tokens ~= nil and seen.limit_tokens ~= cjson.null and seen.limit_tokens > 0 then
    tpm = seen.limit_tokens; redis.call('HSET', KEYS[1], 'tpm', tostring(tpm)) end
  refill()
  local function given(v) return v ~= nil and v ~= cjson.null end
  if rpm > 0 and given(seen.remaining_requests) then r = math.min(r, seen.remaining_requests) end
  if tpm > 0 and given(seen.remaining_tokens) then t = math.min(t, seen.remaining_tokens) end
  save()
end
return '0'
"""


# What tells whether a model is unmetered (buckets.unmetered), as the script names it.
UNMETERED_FIELDS = ("rpm", "tpm", "held", "urgent")


class RedisStore(_TrustsUnmetered):
    """The accounting in Redis: every step one atomic script call; a model with no limit
    costs a call no script (`_TrustsUnmetered`)."""

    def __init__(self, url: str, *, prefix: str = "assistant:capacity:"):
        super().__init__()
        self.url, self.prefix = url, prefix
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @asynccontextmanager
    async def _client(self):
        """A client per event loop; a temporary loop's (tests, `ask --sync`) is closed after use."""
        import redis.asyncio as redis

        loop = asyncio.get_running_loop()
        if pools_connections(loop):
            if loop not in self._clients:
                self._clients[loop] = redis.Redis.from_url(self.url)
            yield self._clients[loop]
            return
        client = redis.Redis.from_url(self.url)
        try:
            yield client
        finally:
            await client.aclose()

    def _inflight_key(self, endpoint: str) -> str:
        return self.prefix + endpoint_key(endpoint) + "inflight"

    async def _run(self, endpoint: str, model: str, op: str, now: float, conf: Limits, *args) -> str:
        keys = [self.prefix + model_key(endpoint, model), self._inflight_key(endpoint)]
        argv = [op, repr(now), conf.rpm or 0, conf.tpm or 0, repr(conf.burst_seconds), *args]
        async with self._client() as client:
            result = await client.register_script(_SCRIPT)(keys=keys, args=argv)
        return result.decode() if isinstance(result, bytes) else str(result)

    async def _state_read(self, key: str) -> dict:
        async with self._client() as client:
            values = await client.hmget(self.prefix + key, UNMETERED_FIELDS)
        return {name: value.decode() for name, value in zip(UNMETERED_FIELDS, values) if value is not None}

    async def acquire(self, endpoint: str, model: str, *, now, tokens, conf, urgent, concurrency, grant_id,
                      expires) -> float:
        if await self._goes_unmetered(model_key(endpoint, model), now=now, conf=conf, concurrency=concurrency,
                                      grant_id=grant_id):
            return 0.0
        return float(await self._run(endpoint, model, "acquire", now, conf, tokens, "1" if urgent else "0",
                                     concurrency, grant_id, repr(expires), repr(buckets.SLOT_POLL_SECONDS),
                                     repr(buckets.URGENT_MARGIN_SECONDS)))

    async def settle(self, endpoint: str, model: str, *, now, conf, reserved, actual, grant_id, concurrency=0) -> None:
        if self._settled_unmetered(grant_id):
            return
        await self._run(endpoint, model, "settle", now, conf, reserved, actual, grant_id)

    async def renew(self, endpoint: str, *, grant_id: str, expires: float) -> None:
        async with self._client() as client:  # XX: a settled grant is not added back
            await client.zadd(self._inflight_key(endpoint), {grant_id: expires}, xx=True)

    async def hold(self, endpoint: str, model: str, *, now: float, conf: Limits, until: float) -> None:
        self._changed(model_key(endpoint, model))
        await self._run(endpoint, model, "hold", now, conf, repr(until))

    async def observe(self, endpoint: str, model: str, *, now: float, conf: Limits, seen: Observed) -> None:
        self._changed(model_key(endpoint, model))
        await self._run(endpoint, model, "observe", now, conf, json.dumps(vars(seen)))
