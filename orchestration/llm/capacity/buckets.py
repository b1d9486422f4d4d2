"""The accounting of one (endpoint, model): two token buckets, a hold, a priority mark.

Requests and tokens each fill a bucket at the per-minute limit / 60 a second, up to
`burst_seconds` worth (at least one request's worth). A call takes one request and its
estimated tokens; it may take the token bucket below zero when it needs more than the
bucket holds (a long prompt on a small limit), so every call fits eventually and the
rate over a minute is still the limit. Settling gives back what the estimate took beyond
what the provider reported (or takes the excess).

A token bucket rather than a per-minute window: providers enforce per-minute limits over
shorter windows too, and a window would let a minute's worth through in its first second.

What a dead process leaves: the tokens it took refill on their own within the burst
window, so only a concurrency slot can be held, and a slot expires (`expires`, the grant's
TTL). Nothing needs cleaning.

`held`: no call until then (a 429's Retry-After).
`urgent`: an orchestrator call is waiting somewhere; until then sub-agent calls are
refused, so the user's question goes first across processes too.

One implementation for the in-process and database stores (this file, on a dict); the
Redis store runs the same steps in Lua (stores.py). tests/orchestration/test_capacity.py
runs the same cases against all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestration.llm.capacity.limits import Limits

# A concurrency cap frees a slot when a call ends: its waiters look again this often.
SLOT_POLL_SECONDS = 0.05
# How long after its expected turn an orchestrator's priority mark lasts.
URGENT_MARGIN_SECONDS = 0.5


@dataclass(frozen=True)
class Observed:
    """What a response's x-ratelimit-* headers said (None: not said)."""

    limit_requests: int | None = None
    limit_tokens: int | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests: float | None = None  # seconds from now
    reset_tokens: float | None = None

    def is_empty(self) -> bool:
        return all(value is None for value in vars(self).values())


def _f(state: dict, key: str, default: float = 0.0) -> float:
    value = state.get(key)
    return default if value in (None, "") else float(value)


def unmetered(state: dict, now: float, conf: Limits) -> bool:
    """Whether a call may go without touching the state: no limit configured or stated,
    no hold, no orchestrator waiting ahead."""
    no_limits = not (_f(state, "rpm") or conf.rpm or _f(state, "tpm") or conf.tpm)
    return no_limits and _f(state, "held") <= now and _f(state, "urgent") <= now


def refill(state: dict, now: float, conf: Limits) -> tuple[float, float, float, float]:
    """Fill both buckets up to `now`; (rpm, tpm, token capacity, request capacity), 0: unlimited.
    A limit the provider stated (observe) wins over the configured one."""
    rpm = _f(state, "rpm") or (conf.rpm or 0)
    tpm = _f(state, "tpm") or (conf.tpm or 0)
    elapsed = max(0.0, now - _f(state, "u", now))
    cap_r = max(1.0, rpm * conf.burst_seconds / 60) if rpm else 0.0
    cap_t = max(1.0, tpm * conf.burst_seconds / 60) if tpm else 0.0
    state["r"] = min(cap_r, _f(state, "r", cap_r) + elapsed * rpm / 60) if rpm else 0.0
    state["t"] = min(cap_t, _f(state, "t", cap_t) + elapsed * tpm / 60) if tpm else 0.0
    state["u"] = now
    return rpm, tpm, cap_t, cap_r


def acquire(state: dict, now: float, *, tokens: int, conf: Limits, urgent: bool,
            inflight: dict | None = None, concurrency: int = 0, grant_id: str = "", expires: float = 0.0) -> float:
    """Take one request and `tokens` if they are there (0.0), else the seconds to wait
    before asking again. `inflight` ({grant id: expires}) is the endpoint's, for its cap."""
    rpm, tpm, cap_t, _ = refill(state, now, conf)
    wait = 0.0
    if _f(state, "held") > now:
        wait = _f(state, "held") - now
    elif not urgent and _f(state, "urgent") > now:
        wait = _f(state, "urgent") - now
    else:
        if concurrency and inflight is not None:
            for grant, until in list(inflight.items()):
                if until <= now:
                    del inflight[grant]
            if len(inflight) >= concurrency:
                wait = SLOT_POLL_SECONDS  # a slot frees when a call ends, or expires
        if not wait:
            if rpm and state["r"] < 1:
                wait = (1 - state["r"]) * 60 / rpm
            need = min(tokens, cap_t)
            if tpm and state["t"] < need:
                wait = max(wait, (need - state["t"]) * 60 / tpm)
    if wait > 0:
        if urgent:
            state["urgent"] = max(_f(state, "urgent"), now + wait + URGENT_MARGIN_SECONDS)
        return wait
    if rpm:
        state["r"] -= 1
    if tpm:
        state["t"] -= tokens
    if urgent:
        state["urgent"] = 0.0
    if concurrency and inflight is not None:
        inflight[grant_id] = expires
    return 0.0


def settle(state: dict, now: float, *, conf: Limits, reserved: int, actual: int) -> None:
    """The call is over: the tokens it took become what it used."""
    _, tpm, cap_t, _ = refill(state, now, conf)
    if tpm:
        state["t"] = min(cap_t, state["t"] + reserved - actual)


def renew(inflight: dict, grant_id: str, expires: float) -> None:
    """A call still on the wire keeps its slot until `expires`; a settled (or lapsed)
    one is not brought back."""
    if grant_id in inflight:
        inflight[grant_id] = expires


def hold(state: dict, until: float) -> None:
    state["held"] = max(_f(state, "held"), until)


def observe(state: dict, now: float, *, conf: Limits, seen: Observed) -> None:
    """The provider's word: its stated limits replace the configured ones; what it says
    remains caps the buckets."""
    if seen.limit_requests:
        state["rpm"] = seen.limit_requests
    if seen.limit_tokens:
        state["tpm"] = seen.limit_tokens
    rpm, tpm, _, _ = refill(state, now, conf)
    if rpm and seen.remaining_requests is not None:
        state["r"] = min(state["r"], seen.remaining_requests)
    if tpm and seen.remaining_tokens is not None:
        state["t"] = min(state["t"], seen.remaining_tokens)
    # Nothing remaining is no hold until the reset: x-ratelimit-reset-* is when the bucket
    # is full again, and the bucket (now empty here too) lets the next call go as soon as
    # its share has refilled. Holding every call until the reset stalled every process
    # ~2 s after each call that left the provider's bucket empty, which a limiter that
    # admits as the bucket refills does all the time (a 429 still holds: Limiter.hold).
