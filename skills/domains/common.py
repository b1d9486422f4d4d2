"""Helpers every domain's handlers share: ownership lookups and date handling."""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.utils import timezone

from skills.base import SkillError


def owned(model: type[models.Model], *, user, pk: int, noun: str) -> models.Model:
    """The user's record `pk`. Another user's record is "not found", like a missing one,
    so ids reveal nothing about other people's data."""
    record = model.objects.filter(owner=user, pk=pk).first()
    if record is None:
        raise SkillError(f"{noun} {pk} not found")
    return record


def parse_date(value: str | None) -> dt.date | None:
    return dt.date.fromisoformat(value) if value else None


def parse_datetime(value: str) -> dt.datetime:
    """An aware datetime; without an offset, in the active time zone: the user's while
    a skill runs for a turn (skills/executor.py), else settings.TIME_ZONE."""
    moment = dt.datetime.fromisoformat(value)
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def iso(value: dt.date | dt.datetime | None) -> str | None:
    if isinstance(value, dt.datetime):
        return timezone.localtime(value).isoformat()
    return value.isoformat() if value else None
