"""A user's time zone: read (creating nothing), validated, and set.

Blank or unknown means settings.TIME_ZONE. The engine snapshots the zone into each turn
(orchestration/turns.py), so skills and prompts read "tomorrow at 2pm" in it.
"""

from __future__ import annotations

import zoneinfo
from functools import cache

from django.conf import settings
from django.utils import timezone

from assistant.models import Preferences


class InvalidTimeZone(ValueError):
    """The name is not an IANA time zone this server knows."""


@cache
def time_zone_names() -> tuple[str, ...]:
    """The names a user may pick, sorted. Cached: available_timezones() walks the tz
    database on disk. "localtime" is a file of the host's, not a zone anyone lives in."""
    return tuple(sorted(zoneinfo.available_timezones() - {"localtime"}))


def is_time_zone(name: str) -> bool:
    return name in _known()


@cache
def _known() -> frozenset[str]:
    return frozenset(time_zone_names())


def stored_time_zone(user) -> str:
    """The user's own zone, or "" when they have none yet (or an anonymous visitor).

    Through the reverse one-to-one, so a row read once is cached on the user object:
    a socket renders many pushes for one owner. A name that stopped being valid (edited
    in the admin, or gone from the tz database) counts as none."""
    preferences = getattr(user, "preferences", None)  # None when no row exists
    name = preferences.time_zone if preferences is not None else ""
    return name if is_time_zone(name) else ""


def user_time_zone(user) -> str:
    """The zone the user's times are read and shown in."""
    return stored_time_zone(user) or settings.TIME_ZONE


def preferences_time_zone_set(*, user, time_zone: str, only_if_unset: bool = False) -> bool:
    """Store the user's zone; False if `only_if_unset` and they have one already.

    `only_if_unset` is for the browser's report on a first visit: it must not overwrite
    a zone the user picked meanwhile in another tab."""
    if not is_time_zone(time_zone):
        raise InvalidTimeZone(f"Unknown time zone {time_zone[:64]!r}: use an IANA name such as Europe/Paris.")
    preferences, created = Preferences.objects.get_or_create(user=user, defaults={"time_zone": time_zone})
    if created:
        return True
    rows = Preferences.objects.filter(pk=preferences.pk)
    if only_if_unset:
        rows = rows.filter(time_zone="")
    return bool(rows.update(time_zone=time_zone, updated_at=timezone.now()))
