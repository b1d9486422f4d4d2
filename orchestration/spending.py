"""What model calls may spend: a user's allowance per day and month, a turn's agent calls.

Every model call, the orchestrator's and every sub-agent's, reserves its estimate from
the user's allowance *before* it is made, and settles to what the provider reported
after (or gives the estimate back when the call failed). The allowance is counted in
rows per user and period (SpendCounter: a day or a calendar month of the user's time
zone), and a reservation locks the day's and the month's rows in key order, then
changes both with one conditional UPDATE (`WHERE tokens <= cap - estimate` for each):
N agents racing on as many workers for the last of a cap cannot all take it, and a
call is counted in both periods or in neither (one transaction).

The estimate is the prompt's characters / SPEND_CHARS_PER_TOKEN (generous: English runs
about four characters a token) plus SPEND_COMPLETION_RESERVE_TOKENS for the answer, and
its price where the model has one. A call can overshoot the cap only by what it used
beyond its own estimate (settling always counts the real use). A worker that dies in a
call leaves its reservation counted: an error that errs toward the cap, never past it.

A call the allowance cannot cover pauses the turn through the continue? machinery
(LimitTripped with SPEND_CAP) with words that say what is left and when it renews;
Continue is refused while the allowance is still spent (`spend_blocked`).
"""

from __future__ import annotations

import json
import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import formats, timezone

from assistant.preferences import user_time_zone
from orchestration.limits import Limits, LimitTripped
from orchestration.llm import Usage
from orchestration.models import SpendAllowance, SpendCounter, Turn
from orchestration.pricing import call_cost, format_usd

SPEND_CAP = "spend_cap"  # the limit of a pause on a user's allowance
DAY, MONTH = SpendCounter.Period.DAY, SpendCounter.Period.MONTH


# --- the turn's count of agent model calls -------------------------------------------------


def agent_call_reserve(*, turn_id: int, limits: Limits) -> None:
    """Count one sub-agent model call against the turn's cap, or trip it (LimitTripped)."""
    if Turn.objects.filter(pk=turn_id, agent_llm_calls__lt=limits.turn_max_llm_calls).update(
        agent_llm_calls=F("agent_llm_calls") + 1
    ):
        return
    # The turn's snapshot may have been raised by a Continue since this agent read it.
    current, used = Turn.objects.values_list("limits", "agent_llm_calls").get(pk=turn_id)
    limit = Limits.from_json(current).turn_max_llm_calls
    if limit > limits.turn_max_llm_calls:
        return agent_call_reserve(turn_id=turn_id, limits=Limits.from_json(current))
    raise LimitTripped(
        "turn_max_llm_calls", f"The agents made {used} model calls on this turn (limit {limit}).",
        detail={"limit": limit, "used": used},
    )


def agent_call_release(*, turn_id: int) -> None:
    """Give back a counted call that was not made (the allowance refused it)."""
    Turn.objects.filter(pk=turn_id, agent_llm_calls__gt=0).update(agent_llm_calls=F("agent_llm_calls") - 1)


# --- the user's allowance --------------------------------------------------------------------


@dataclass(frozen=True)
class Caps:
    """A user's allowance in force: tokens and dollars per day and month (0: no cap)."""

    tokens_per_day: int
    tokens_per_month: int
    usd_per_day: Decimal
    usd_per_month: Decimal

    def tokens(self, period: str) -> int:
        return self.tokens_per_day if period == DAY else self.tokens_per_month

    def usd(self, period: str) -> Decimal:
        return self.usd_per_day if period == DAY else self.usd_per_month


def caps_for(user) -> Caps:
    """The site's defaults (settings.ASSISTANT_SPEND), overridden field by field by the
    user's own allowance where staff set one."""
    site = settings.ASSISTANT_SPEND
    values = {
        "tokens_per_day": int(site["tokens_per_day"]), "tokens_per_month": int(site["tokens_per_month"]),
        "usd_per_day": Decimal(str(site["usd_per_day"])), "usd_per_month": Decimal(str(site["usd_per_month"])),
    }
    own = SpendAllowance.objects.filter(user_id=user.pk).values(*values).first() or {}
    values.update({name: value for name, value in own.items() if value is not None})
    return Caps(**values)


@dataclass(frozen=True)
class Period:
    """A day or a calendar month in the user's time zone."""

    name: str
    starts_on: date
    renews_at: datetime  # aware, in the user's zone
    time_zone: str


def periods_of(user, now: datetime | None = None) -> tuple[Period, Period]:
    """The user's day and month now: midnight and the first of the month where they live."""
    name = user_time_zone(user)
    zone = zoneinfo.ZoneInfo(name)
    today = timezone.localtime(now or timezone.now(), zone).date()
    first = today.replace(day=1)
    next_month = (first + timedelta(days=32)).replace(day=1)
    return (
        Period(DAY, today, datetime.combine(today + timedelta(days=1), time(), zone), name),
        Period(MONTH, first, datetime.combine(next_month, time(), zone), name),
    )


def call_estimate(*, model: str, messages: list[dict], tools: list[dict]) -> tuple[int, Decimal]:
    """What a call is reserved at: tokens, and dollars where the model has a price."""
    spend = settings.ASSISTANT_SPEND
    chars = len(json.dumps(messages, ensure_ascii=False)) + len(json.dumps(tools, ensure_ascii=False))
    prompt = chars // int(spend["chars_per_token"]) + 1
    completion = int(spend["completion_reserve_tokens"])
    cost = call_cost(model, Usage(prompt_tokens=prompt, completion_tokens=completion)) or Decimal(0)
    return prompt + completion, cost


@dataclass(frozen=True)
class Reservation:
    """A call's estimate, taken from the user's rows for the periods it was made in (a
    call across midnight settles on the day it started)."""

    user_id: int
    starts: tuple[tuple[str, date], ...]
    tokens: int
    cost_usd: Decimal


def spend_reserve(*, user, model: str, messages: list[dict], tools: list[dict], caps: Caps | None = None
                  ) -> Reservation:
    """Reserve a model call's estimate from the user's allowance, or trip SPEND_CAP.
    `caps`: the user's allowance as the caller read it (an agent, once per delivery)."""
    tokens, cost = call_estimate(model=model, messages=messages, tools=tools)
    caps = caps or caps_for(user)
    periods = periods_of(user)
    if not _take(user, periods, caps, tokens, cost):
        raise _trip(user, periods, caps, tokens, cost)
    return Reservation(user_id=user.pk, starts=_starts(periods), tokens=tokens, cost_usd=cost)


def _take(user, periods: tuple[Period, ...], caps: Caps, tokens: int, cost: Decimal) -> bool:
    """One UPDATE of the day's and the month's rows, each under its own cap; both or
    neither (a transaction), and the rows made on a period's first call."""
    room = Q()
    for period in periods:
        fits = Q(period=period.name, starts_on=period.starts_on)
        if caps.tokens(period.name):
            fits &= Q(tokens__lte=caps.tokens(period.name) - tokens)
        if caps.usd(period.name):
            fits &= Q(cost_usd__lte=caps.usd(period.name) - cost)
        room |= fits
    for first_try in (True, False):
        with transaction.atomic():
            present = _lock_in_order(user.pk, _starts(periods))
            if present == len(periods):  # locked: the UPDATE's answer is the last word
                taken = SpendCounter.objects.filter(room, user_id=user.pk).update(
                    tokens=F("tokens") + tokens, cost_usd=F("cost_usd") + cost, updated_at=timezone.now())
                if taken == len(periods):
                    return True
                transaction.set_rollback(True)  # one period had room, another not: neither counts
                return False
        if not first_try:
            break
        for period in periods:  # the period's first call: make its row, then try again
            SpendCounter.objects.get_or_create(user_id=user.pk, period=period.name, starts_on=period.starts_on)
    return False


def _starts(periods) -> tuple[tuple[str, date], ...]:
    return tuple((p.name, p.starts_on) for p in periods)


def _rows(user_id: int, starts: tuple[tuple[str, date], ...]):
    which = Q()
    for name, starts_on in starts:
        which |= Q(period=name, starts_on=starts_on)
    return SpendCounter.objects.filter(which, user_id=user_id)


def spend_settle(*, reservation: Reservation | None, usage: Usage, cost: Decimal | None) -> None:
    """Replace the call's estimate by what it used (before the response is stored, on
    its own: a call that happened counts even if storing it fails)."""
    if reservation is not None:
        _adjust(reservation, usage.prompt_tokens + usage.completion_tokens - reservation.tokens,
                (cost or Decimal(0)) - reservation.cost_usd)


def spend_release(*, reservation: Reservation | None) -> None:
    """Give back the estimate of a call that was not made or failed."""
    if reservation is not None:
        _adjust(reservation, -reservation.tokens, -reservation.cost_usd)


def _adjust(reservation: Reservation, tokens: int, cost: Decimal) -> None:
    if tokens or cost:
        with transaction.atomic():
            _lock_in_order(reservation.user_id, reservation.starts)
            _rows(reservation.user_id, reservation.starts).update(
                tokens=F("tokens") + tokens, cost_usd=F("cost_usd") + cost, updated_at=timezone.now())


def _lock_in_order(user_id: int, starts: tuple[tuple[str, date], ...]) -> int:
    """Lock the day's and the month's rows in primary-key order before one UPDATE
    changes both. An UPDATE locks rows in the order its scan meets them, and each update
    moves a row's new version elsewhere in the table, so two concurrent UPDATEs of the
    same pair could meet them in opposite orders and deadlock (PostgreSQL did, at 100
    agents in flight: tests/live/test_runner.py). SQLite serialises writers anyway.
    Returns how many of the rows exist."""
    return len(_rows(user_id, starts).select_for_update().order_by("pk").values_list("pk", flat=True))


@dataclass(frozen=True)
class PeriodUse:
    """One period's use against its allowance (reservations of calls in flight included)."""

    period: Period
    tokens: int
    cost_usd: Decimal
    tokens_cap: int
    usd_cap: Decimal

    def fits(self, tokens: int, cost: Decimal) -> bool:
        return ((not self.tokens_cap or self.tokens + tokens <= self.tokens_cap)
                and (not self.usd_cap or self.cost_usd + cost <= self.usd_cap))

    def text(self) -> str:
        """"1,234 of 10,000 tokens · $0.0100 of $1.00" (the admin's column)."""
        tokens = f"{self.tokens:,} of {self.tokens_cap:,} tokens" if self.tokens_cap else f"{self.tokens:,} tokens"
        cost = format_usd(self.cost_usd) + (f" of {format_usd(self.usd_cap)}" if self.usd_cap else "")
        return f"{tokens} · {cost}"


def spend_use(user, caps: Caps | None = None, periods: tuple[Period, Period] | None = None) -> list[PeriodUse]:
    """The user's day and month so far against their allowance (a selector)."""
    caps = caps or caps_for(user)
    periods = periods or periods_of(user)
    rows = {(name, starts): (tokens, cost) for name, starts, tokens, cost in SpendCounter.objects.filter(
        user_id=user.pk, starts_on__in=[p.starts_on for p in periods]).values_list(
        "period", "starts_on", "tokens", "cost_usd")}
    uses = []
    for period in periods:
        tokens, cost = rows.get((period.name, period.starts_on), (0, Decimal(0)))
        uses.append(PeriodUse(period=period, tokens=max(0, tokens), cost_usd=max(Decimal(0), cost),
                              tokens_cap=caps.tokens(period.name), usd_cap=caps.usd(period.name)))
    return uses


def _trip(user, periods, caps: Caps, tokens: int, cost: Decimal) -> LimitTripped:
    """The pause for a call the allowance cannot cover: the period that blocks it longest."""
    uses = spend_use(user, caps, periods)
    blocking = [use for use in uses if not use.fits(tokens, cost)] or uses[:1]
    use = blocking[-1]
    detail = _detail(use, tokens, cost)
    return LimitTripped(SPEND_CAP, cap_reached_words(detail), detail=detail)


def _detail(use: PeriodUse, tokens: int, cost: Decimal) -> dict:
    in_tokens = bool(use.tokens_cap) and use.tokens + tokens > use.tokens_cap
    return {
        "period": use.period.name, "kind": "tokens" if in_tokens or not use.usd_cap else "usd",
        "used": use.tokens, "allowance": use.tokens_cap, "needed": tokens,
        "used_usd": f"{use.cost_usd:f}", "allowance_usd": f"{use.usd_cap:f}", "needed_usd": f"{cost:f}",
        "renews_at": use.period.renews_at.isoformat(), "time_zone": use.period.time_zone,
    }


def spend_blocked(*, user, detail: dict) -> str:
    """Why Continue cannot resume a turn paused on the allowance ("" when it can): the
    next call (as large as the one that tripped) still does not fit."""
    tokens, cost = int(detail.get("needed", 0)), Decimal(detail.get("needed_usd") or 0)
    uses = [use for use in spend_use(user) if not use.fits(tokens, cost)]
    if not uses:
        return ""
    still = _detail(uses[-1], tokens, cost)
    return (f"Your {_period_words(still)} allowance is still spent: {_left_words(still)}. "
            f"It renews {_renewal_words(still)}; Continue works again then, or once staff raise your "
            "allowance. Stop ends the turn with what is done.")


# --- words -------------------------------------------------------------------------------------


def _period_words(detail: dict) -> str:
    return "daily" if detail["period"] == DAY else "monthly"


def _left_amount(detail: dict) -> str:
    if detail["kind"] == "tokens":
        return f"{max(0, detail['allowance'] - detail['used']):,} tokens"
    return format_usd(max(Decimal(0), Decimal(detail["allowance_usd"]) - Decimal(detail["used_usd"])))


def _allowance_words(detail: dict) -> str:
    if detail["kind"] == "tokens":
        return f"{detail['allowance']:,} tokens"
    return format_usd(Decimal(detail["allowance_usd"]))


def _needed_words(detail: dict) -> str:
    if detail["kind"] == "tokens":
        return f"{detail['needed']:,} tokens"
    return format_usd(Decimal(detail["needed_usd"]))


def _left_words(detail: dict) -> str:
    return (f"{_left_amount(detail)} of your {_allowance_words(detail)} left, and the next model call "
            f"needs about {_needed_words(detail)}")


def _renewal_words(detail: dict) -> str:
    zone = detail.get("time_zone") or settings.TIME_ZONE
    at = datetime.fromisoformat(detail["renews_at"]).astimezone(zoneinfo.ZoneInfo(zone))
    when = "at midnight" if detail["period"] == DAY else "on the first of the month"
    return f"{when} ({formats.date_format(at, 'D j M, H:i')}, {zone})"


def cap_label(detail: dict) -> str:
    kind = "token" if detail.get("kind") == "tokens" else "spending"
    return f"your {_period_words(detail)} {kind} allowance"


def cap_reached_words(detail: dict) -> str:
    """Why the turn stopped: what is left, and when it renews."""
    spent = "today" if detail["period"] == DAY else "this month"
    used = (f"{detail['used']:,} tokens" if detail["kind"] == "tokens"
            else format_usd(Decimal(detail["used_usd"])))
    return (f"You have used {used} of your {_allowance_words(detail)} {spent}: {_left_amount(detail)} left, "
            f"not enough for the next model call (about {_needed_words(detail)}). "
            f"Your allowance renews {_renewal_words(detail)}.")


CAP_GRANT = "Continue cannot pass this cap: it resumes the turn once the allowance renews or staff raise it."
