"""Helpers every domain's handlers share: ownership lookups and date handling."""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.utils import formats, timezone

from skills.base import SkillError


def owned(model: type[models.Model], *, user, pk: int, noun: str) -> models.Model:
    """The user's record `pk`. Another user's record is "not found", like a missing one,
    so ids reveal nothing about other people's data."""
    record = model.objects.filter(owner=user, pk=pk).first()
    if record is None:
        raise SkillError(f"{noun} {pk} not found")
    return record


# Times a skill accepts. Python's datetime stops at years 1 and 9999, so a time near
# either end overflows when shifted to UTC or by a duration ("9999-12-31T23:59" plus an
# hour): one well inside both ends makes every sum a skill computes safe, and refuses
# absurd dates with a sentence the model can act on instead of an OverflowError.
EARLIEST = dt.datetime(1000, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
# The widest UTC offsets in use (Baker Island, Kiribati). Python takes up to ±23:59;
# PostgreSQL refuses anything past ±15:59 in the INSERT.
MAX_OFFSET = dt.timedelta(hours=14)


def parse_date(value: str | None, *, field: str = "date") -> dt.date | None:
    if not value:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise SkillError(f"'{field}' must be a date in YYYY-MM-DD format") from None


def parse_datetime(value: str, *, field: str = "time") -> dt.datetime:
    """An aware datetime; without an offset, in the active time zone: the user's while
    a skill runs for a turn (skills/executor.py), else settings.TIME_ZONE. Times before
    EARLIEST or from LATEST on are refused (SkillError naming `field`)."""
    try:
        moment = dt.datetime.fromisoformat(value)
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        in_range = EARLIEST <= moment < LATEST
    except (ValueError, OverflowError):
        # Not a time, or one so near year 1 or 9999 that its offset alone overflows.
        in_range = False
    if not in_range:
        raise SkillError(
            f"'{field}' is out of range: give a time from year {EARLIEST.year} to {LATEST.year - 1}, "
            "e.g. 2026-03-01T09:30:00+01:00"
        )
    if abs(moment.utcoffset()) > MAX_OFFSET:
        raise SkillError(f"'{field}' has a UTC offset beyond ±14:00, which no place on Earth uses")
    return moment


def shifted(moment: dt.datetime, delta: dt.timedelta, *, what: str) -> dt.datetime:
    """`moment + delta`, or a SkillError saying `what` would fall out of range."""
    try:
        result = moment + delta
    except OverflowError:
        result = None
    if result is None or not EARLIEST <= result < LATEST:
        raise SkillError(f"{what} would be out of range (after year {LATEST.year - 1})")
    return result


def when_words(value) -> str:
    """A time a skill stored as ISO text, as a person reads it: "Fri 27 Nov 2026, 14:00",
    in the offset it was written with (the user's zone when the skill ran: see `iso`).
    Anything else as it is."""
    try:
        moment = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if "T" not in str(value):  # a date alone
        return formats.date_format(moment, "D j M Y")
    return formats.date_format(moment, "D j M Y, H:i")


def iso(value: dt.date | dt.datetime | None) -> str | None:
    if isinstance(value, dt.datetime):
        return timezone.localtime(value).isoformat()
    return value.isoformat() if value else None
