"""What model calls may spend: a user's allowance per day and month, a turn's agent calls.

Under a cap, every model call, the orchestrator's and every sub-agent's, reserves its
estimate from the user's allowance *before* it is made, and settles to what the provider
reported after (or gives the estimate back when the call failed). With no cap in force
nothing can trip, so a delivery adds its calls up and writes them once, at its end
(`SpendMeter`): the counters are then only the spend page's figures, and a step writes
nothing to them.

Periods. The allowance is counted in rows per user and period (SpendCounter): a day or a
calendar month that keeps the zone it started in and ends at its own `ends_at`. The
current period of each kind is the row that ends after now. The first call after one
ends starts the next in the user's zone *then*: from that zone's midnight (the first of
its month) or the previous period's end, whichever is later, to the first midnight (first
of the month) of that zone at least SHORTEST after its start. So a time-zone change
applies from the next period and cannot reset the current one, and hopping zones
westward cannot start a period every hour: each lasts 20 hours (27 days) at least, so
zone changes can add at most about one period a day.

Reserving. A reservation locks the user's current rows in key order and reads them in
that same SELECT, then takes the estimate from both with one UPDATE (two statements in
the steady state): N agents racing on as many workers for the last of a cap cannot all
take it, and a call is counted in both periods or in neither (one transaction). A
period's first call makes its row with the user's row locked, so that calls racing to
start a period start one.

The estimate and the allowance. A call is reserved at its prompt's characters /
SPEND_CHARS_PER_TOKEN (generous: English runs about four characters a token) plus an
allowance for its answer: SPEND_COMPLETION_RESERVE_TOKENS, and while a cap is in force
no more than the tightest cap leaves after the prompt (a dollar cap at the model's
output price, where it has one). The request sends that allowance as `max_tokens`, so the
provider stops there: a call can pass the cap only by what its prompt used beyond its
estimate. A call whose allowance would fall below SPEND_MIN_COMPLETION_TOKENS trips the
cap instead. A worker that dies in a call leaves its reservation counted: an error that
errs toward the cap, never past it.

A call the allowance cannot cover pauses the turn through the continue? machinery
(LimitTripped with SPEND_CAP) with words that say what is left and when the period
renews, in its own zone; Continue is refused while the allowance is still spent
(`spend_blocked`).
"""

from __future__ import annotations

import json
import math
import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F
from django.utils import formats, timezone

from orchestration.budgets.limits import Limits, LimitTripped
from orchestration.budgets.pricing import MILLION, call_cost, format_usd, price_for
from orchestration.llm import Usage
from orchestration.models import SpendAllowance, SpendCounter, Turn
from orchestration.records.compiled import CompiledRead, CompiledUpdate
from orchestration.zones import user_time_zone

SPEND_CAP = "spend_cap"  # the limit of a pause on a user's allowance
DAY, MONTH = SpendCounter.Period.DAY, SpendCounter.Period.MONTH


# --- the turn's count of agent model calls -------------------------------------------------


def agent_call_reserve(*, turn_id: int, limits: Limits) -> None:
    """Count one sub-agent model call against the turn's cap, or trip it (LimitTripped)."""
    if agent_calls_reserve(turn_id=turn_id, limits=limits, count=1):
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


def agent_calls_reserve(*, turn_id: int, limits: Limits, count: int) -> bool:
    """Count `count` sub-agent model calls against the turn's cap in one UPDATE, if all
    fit; else count none (False). Agents that start together count their first calls so;
    `agent_call_reserve` counts one and trips the limit when it does not fit."""
    return bool(Turn.objects.filter(pk=turn_id, agent_llm_calls__lte=limits.turn_max_llm_calls - count).update(
        agent_llm_calls=F("agent_llm_calls") + count))


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

    @property
    def unlimited(self) -> bool:
        return not (self.tokens_per_day or self.tokens_per_month or self.usd_per_day or self.usd_per_month)

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
    for own in _allowance_of.dicts(user.pk):
        values.update({name: value for name, value in own.items() if value is not None})
    return Caps(**values)


# Read once per delivery of every agent: compiled once (orchestration/records/compiled.py).
_allowance_of = CompiledRead(lambda user_id: SpendAllowance.objects.filter(user_id=user_id).order_by("pk").values(
    "tokens_per_day", "tokens_per_month", "usd_per_day", "usd_per_month")[:1])


# --- periods -----------------------------------------------------------------------------------

KINDS = (DAY, MONTH)
# A new period ends at the first midnight (first of the month) of its zone at least this
# long after it starts: shorter than any local day (23 hours across a clock change) or
# month, so a period that starts at its zone's midnight runs to the next as it always
# did; long enough that hopping zones cannot renew the allowance every hour.
SHORTEST = {DAY: timedelta(hours=20), MONTH: timedelta(days=27)}


@dataclass(frozen=True)
class Period:
    """A day or a calendar month of the zone it started in, to its own end."""

    name: str
    starts_on: date  # its label: its first local day, unique per user and kind
    renews_at: datetime  # its end, aware, in its zone
    time_zone: str


def _period_starting(name: str, zone_name: str, now: datetime, previous: tuple[date, datetime] | None) -> Period:
    """The period a call at `now` starts in the zone: from its midnight (first of the month)
    or the previous period's end, whichever is later, to the first midnight at least
    SHORTEST after. Labelled with its local day (first of the month), or past the previous
    label where that is later: after a move westward the zone's date may not have passed
    it yet."""
    zone = zoneinfo.ZoneInfo(zone_name)
    label = _first_day(name, timezone.localtime(now, zone).date())
    starts_at = _midnight(label, zone)
    if previous is not None:
        previous_label, previous_end = previous
        label, starts_at = max(label, _following(name, previous_label)), max(starts_at, previous_end)
    return Period(name, label, _boundary_from(name, starts_at + SHORTEST[name], zone), zone_name)


def _boundary_from(name: str, moment: datetime, zone) -> datetime:
    """The first midnight (first of the month) of the zone at or after `moment`."""
    day = _first_day(name, timezone.localtime(moment, zone).date())
    boundary = _midnight(day, zone)
    return boundary if boundary >= moment else _midnight(_following(name, day), zone)


def _first_day(name: str, day: date) -> date:
    return day if name == DAY else day.replace(day=1)


def _following(name: str, day: date) -> date:
    return day + timedelta(days=1) if name == DAY else (day.replace(day=1) + timedelta(days=32)).replace(day=1)


def _midnight(day: date, zone) -> datetime:
    return datetime.combine(day, time(), zone)


def _periods_starting(user, now: datetime, names: list[str]) -> list[Period]:
    """The periods of these kinds that a call at `now` starts, in the user's zone now."""
    if not names:
        return []  # without reading the zone
    zone = user_time_zone(user)
    latest = SpendCounter.objects.filter(user_id=user.pk).order_by("-starts_on")
    return [_period_starting(name, zone, now, latest.filter(period=name).values_list("starts_on", "ends_at").first())
            for name in names]


@transaction.atomic
def spend_periods_start(*, user, now: datetime) -> None:
    """Make the rows of the user's periods that have none current: a period's first call.

    The user's row is locked first (FOR NO KEY UPDATE: rows that refer to the user can
    still be written meanwhile), so calls racing to start a period take turns and the
    second finds the first's row, even if the zone changed between them (their labels
    would differ, and the unique key would not stop both). Its own transaction, never
    inside the reservation's: that one holds period rows, and a user's deletion locks the
    user's row before those (orchestration/reports/retention.py)."""
    user = (get_user_model().objects.select_for_update(no_key=True, of=("self",)).select_related("preferences")
            .get(pk=user.pk))  # and the zone as it is now, not as a long-lived caller read it
    started = {name for _, name, *_ in _current_rows(user.pk, now)}
    for period in _periods_starting(user, now, [name for name in KINDS if name not in started]):
        SpendCounter.objects.create(user_id=user.pk, period=period.name, starts_on=period.starts_on,
                                    ends_at=period.renews_at, time_zone=period.time_zone)


def _current_rows(user_id: int, now: datetime, *, lock: bool = False) -> list[tuple]:
    """The user's rows of the periods current at `now`, with what they counted; locked
    (in key order) for a reservation."""
    return (_current_locked if lock else _current)(user_id, now)


def _current_read(*, lock: bool) -> CompiledRead:
    """Read (or locked) with every reservation and every delivery's spend: compiled once."""
    def build(user_id, now):
        rows = SpendCounter.objects.filter(user_id=user_id, ends_at__gt=now)
        return (_in_order(rows) if lock else rows).values_list(
            "pk", "period", "starts_on", "ends_at", "time_zone", "tokens", "cost_usd")
    return CompiledRead(build, arity=2)


_current, _current_locked = _current_read(lock=False), _current_read(lock=True)


def _in_order(rows):
    """Lock the rows in primary-key order before one UPDATE changes them. An UPDATE locks
    rows in the order its scan meets them, and each update moves a row's new version
    elsewhere in the table, so two concurrent UPDATEs of the same pair could meet them in
    opposite orders and deadlock (PostgreSQL did, at 100 agents in flight:
    tests/live/test_runner.py). SQLite serialises writers anyway."""
    return rows.select_for_update().order_by("pk")


# --- what a call may take ------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodUse:
    """One period's use against its allowance (reservations of calls in flight included)."""

    period: Period
    tokens: int
    cost_usd: Decimal
    tokens_cap: int
    usd_cap: Decimal
    row_id: int | None = None  # None: the period has not started (no call yet)

    def fits(self, tokens: int, cost: Decimal) -> bool:
        return ((not self.tokens_cap or self.tokens + tokens <= self.tokens_cap)
                and (not self.usd_cap or self.cost_usd + cost <= self.usd_cap))

    def text(self) -> str:
        """"1,234 of 10,000 tokens · $0.0100 of $1.00" (the admin's column)."""
        tokens = f"{self.tokens:,} of {self.tokens_cap:,} tokens" if self.tokens_cap else f"{self.tokens:,} tokens"
        cost = format_usd(self.cost_usd) + (f" of {format_usd(self.usd_cap)}" if self.usd_cap else "")
        return f"{tokens} · {cost}"


def _uses(rows: list[tuple], caps: Caps) -> dict[str, PeriodUse]:
    """The use of each kind's current period, from its row. Should two rows of a kind be
    current (periods counted before they kept their zone, migration 0015), the one that
    ends first is the period now is in."""
    uses: dict[str, PeriodUse] = {}
    for pk, name, starts_on, ends_at, zone, tokens, cost in sorted(rows, key=lambda row: row[3]):
        zone = zone or settings.TIME_ZONE
        period = Period(name, starts_on, ends_at.astimezone(zoneinfo.ZoneInfo(zone)), zone)
        uses.setdefault(name, PeriodUse(period=period, tokens=max(0, tokens), cost_usd=max(Decimal(0), cost),
                                        tokens_cap=caps.tokens(name), usd_cap=caps.usd(name), row_id=pk))
    return uses


def spend_use(user, caps: Caps | None = None, now: datetime | None = None) -> list[PeriodUse]:
    """The user's day and month so far against their allowance (a selector): the current
    periods, each in its own zone; a period no call has started yet is the one a call
    would start now, unused."""
    caps, now = caps or caps_for(user), now or timezone.now()
    uses = _uses(_current_rows(user.pk, now), caps)
    for period in _periods_starting(user, now, [name for name in KINDS if name not in uses]):
        uses[period.name] = PeriodUse(period=period, tokens=0, cost_usd=Decimal(0),
                                      tokens_cap=caps.tokens(period.name), usd_cap=caps.usd(period.name))
    return [uses[name] for name in KINDS]


def prompt_estimate(*, messages: list[dict], tools: list[dict]) -> int:
    """A prompt's tokens, reckoned generously from its characters."""
    chars = len(json.dumps(messages, ensure_ascii=False)) + len(json.dumps(tools, ensure_ascii=False))
    return chars // int(settings.ASSISTANT_SPEND["chars_per_token"]) + 1


def _completion_tokens() -> tuple[int, int]:
    """The answer's allowance at most (SPEND_COMPLETION_RESERVE_TOKENS) and at least
    (SPEND_MIN_COMPLETION_TOKENS, never above the most)."""
    most = int(settings.ASSISTANT_SPEND["completion_reserve_tokens"])
    return most, min(most, int(settings.ASSISTANT_SPEND["min_completion_tokens"]))


def _allowance(uses: list[PeriodUse], *, model: str, prompt: int, most: int) -> int | None:
    """The most a call may answer while a cap is in force: what the tightest cap leaves
    after the prompt, in tokens, or in dollars at the model's output price (a model with
    no price counts against no dollar cap); at most `most`. None when no cap bounds it."""
    price = price_for(model)
    rooms = []
    for use in uses:
        if use.tokens_cap:
            rooms.append(use.tokens_cap - use.tokens - prompt)
        if use.usd_cap and price is not None and price.output:
            left = use.usd_cap - use.cost_usd - prompt * price.input / MILLION
            rooms.append(math.floor(left * MILLION / price.output))
    return min(most, *rooms) if rooms else None


def _cost(model: str, prompt: int, completion: int) -> Decimal:
    return call_cost(model, Usage(prompt_tokens=prompt, completion_tokens=completion)) or Decimal(0)


@dataclass(frozen=True)
class Reservation:
    """A call's estimate, taken from the rows of the periods it was made in (a call across
    a period's end settles in the period it started), and the most it may answer: the
    request's `max_tokens` (None: no cap bounds it, none is sent)."""

    rows: tuple[int, ...]
    tokens: int
    cost_usd: Decimal
    max_tokens: int | None = None


def spend_reserve(*, user, model: str, messages: list[dict], tools: list[dict], caps: Caps | None = None
                  ) -> Reservation:
    """Reserve a model call's estimate from the user's allowance, or trip SPEND_CAP.
    `caps`: the user's allowance as the caller read it (an agent, once per delivery)."""
    caps, now = caps or caps_for(user), timezone.now()
    prompt = prompt_estimate(messages=messages, tools=tools)
    reservation = _reserve(user.pk, caps, now, model=model, prompt=prompt)
    if reservation is None:  # the first call of a period
        spend_periods_start(user=user, now=now)
        reservation = _reserve(user.pk, caps, now, model=model, prompt=prompt)
    return reservation


@transaction.atomic
def _reserve(user_id: int, caps: Caps, now: datetime, *, model: str, prompt: int) -> Reservation | None:
    """Read and lock the current periods (one SELECT), take the call's estimate from both
    (one UPDATE) or trip the cap; None when a period has not started."""
    current = _uses(_current_rows(user_id, now, lock=True), caps)
    if len(current) < len(KINDS):
        return None
    uses = [current[name] for name in KINDS]
    most, least = _completion_tokens()
    allowance = _allowance(uses, model=model, prompt=prompt, most=most)
    completion = most if allowance is None else allowance
    tokens, cost = prompt + completion, _cost(model, prompt, completion)
    if completion < least or not all(use.fits(tokens, cost) for use in uses):
        raise _trip(uses, prompt + least, _cost(model, prompt, least))
    rows = tuple(use.row_id for use in uses)
    _counted(rows, tokens=tokens, cost=cost, now=now)
    return Reservation(rows=rows, tokens=tokens, cost_usd=cost, max_tokens=allowance)


def spend_add(*, user, tokens: int, cost: Decimal) -> None:
    """Count calls already made (no cap was in force to reserve them from)."""
    if not (tokens or cost):
        return
    now = timezone.now()
    with transaction.atomic():
        rows = [row[0] for row in _current_rows(user.pk, now, lock=True)]
        if len(rows) == len(KINDS):
            _counted(rows, tokens=tokens, cost=cost, now=now)
            return
    spend_periods_start(user=user, now=now)  # the period's first calls
    spend_add(user=user, tokens=tokens, cost=cost)


@dataclass(eq=False)
class SpendMeter:
    """What one delivery's model calls spend from its owner's allowance.

    Under a cap each call is reserved before it is made and settled after, so that the
    cap holds while parallel agents spend. With no cap nothing can trip: the calls are
    added up here and written once, by `flush` at the delivery's end (a worker that dies
    before it loses its count on the spend page, not a guarantee). The caps are read
    once a delivery; a Continue starts another."""

    user: object
    caps: Caps | None = None
    reservation: Reservation | None = None
    tokens: int = 0
    cost: Decimal = Decimal(0)

    def reserve(self, *, model: str, messages: list[dict], tools: list[dict]) -> Reservation | None:
        """The call's reservation (None: no cap, nothing reserved), or LimitTripped."""
        if self.caps is None:
            self.caps = caps_for(self.user)
        self.reservation = None if self.caps.unlimited else spend_reserve(
            user=self.user, model=model, messages=messages, tools=tools, caps=self.caps)
        return self.reservation

    @property
    def max_tokens(self) -> int | None:
        return self.reservation.max_tokens if self.reservation else None

    def settle(self, usage: Usage, cost: Decimal | None) -> None:
        """The call was answered: it counts at what it used."""
        if self.reservation is None:
            self.tokens += usage.prompt_tokens + usage.completion_tokens
            self.cost += cost or Decimal(0)
        else:
            spend_settle(reservation=self.reservation, usage=usage, cost=cost)
        self.reservation = None

    def release(self) -> None:
        """The call was not made, or failed."""
        spend_release(reservation=self.reservation)
        self.reservation = None

    def flush(self) -> None:
        """Write what the calls made without a reservation used (its own transaction:
        a period's first call locks the user's row, which comes before any other)."""
        spend_add(user=self.user, tokens=self.tokens, cost=self.cost)
        self.tokens, self.cost = 0, Decimal(0)


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
        rows = SpendCounter.objects.filter(pk__in=reservation.rows)
        with transaction.atomic():
            list(_in_order(rows).values_list("pk", flat=True))  # locked, then changed
            rows.update(tokens=F("tokens") + tokens, cost_usd=F("cost_usd") + cost, updated_at=timezone.now())


def _counted(rows, *, tokens: int, cost: Decimal, now: datetime) -> None:
    """Add to the rows of the current periods, one of each KIND (locked already): one UPDATE."""
    first, second = rows
    _counting(first=first, second=second, tokens=tokens, cost=cost, now=now)


# Every reservation and every delivery's spend runs it: compiled once.
_counting = CompiledUpdate(lambda p: (SpendCounter.objects.filter(pk__in=[p.first, p.second]), {
    "tokens": F("tokens") + p.tokens, "cost_usd": F("cost_usd") + p.cost, "updated_at": p.now}))


def _trip(uses: list[PeriodUse], tokens: int, cost: Decimal) -> LimitTripped:
    """The pause for a call the allowance cannot cover (`tokens` and `cost`: the least it
    needs): the period that blocks it longest."""
    blocking = [use for use in uses if not use.fits(tokens, cost)] or uses[:1]
    detail = _detail(max(blocking, key=lambda use: use.period.renews_at), tokens, cost)
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
    next call (needing as much as the one that tripped) still does not fit."""
    tokens, cost = int(detail.get("needed", 0)), Decimal(detail.get("needed_usd") or 0)
    uses = [use for use in spend_use(user) if not use.fits(tokens, cost)]
    if not uses:
        return ""
    still = _detail(max(uses, key=lambda use: use.period.renews_at), tokens, cost)
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
