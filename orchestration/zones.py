"""A user's time zone as the engine reads it: blank or unknown means settings.TIME_ZONE.

The engine snapshots the zone into each turn (orchestration/lifecycle/turns.py), so skills and
prompts read "tomorrow at 2pm" in it, and a spend period keeps the zone it started in
(orchestration/budgets/spending.py). The zone is stored on the user's preferences row
(`user.preferences`, the assistant app's), which the assistant sets
(assistant/preferences.py); the engine reads it here and imports nothing of the app.
"""

from __future__ import annotations

import zoneinfo
from functools import cache

from django.conf import settings


@cache
def time_zone_names() -> tuple[str, ...]:
    """The names a user may pick, sorted. Cached: available_timezones() walks the tz
    database on disk. "localtime" is a file of the host's, not a zone anyone lives in."""
    return tuple(sorted(zoneinfo.available_timezones() - {"localtime"}))


# The areas people live in, as the tz database names its canonical zones; the rest of its
# names are aliases and relics ("US/Eastern", "EST5EDT", "Etc/GMT+3", "Factory").
PICKED_AREAS = ("Africa", "America", "Antarctica", "Asia", "Atlantic", "Australia", "Europe", "Indian", "Pacific")


@cache
def time_zone_groups() -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """What the picker offers: UTC, then each area's zones as (name, "Buenos Aires"),
    grouped by area. Any valid name is still accepted (`is_time_zone`): one stored
    before stays selected (the page adds it)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for name in time_zone_names():
        area, _, place = name.partition("/")
        if area in PICKED_AREAS and place:
            groups.setdefault(area, []).append((name, place.replace("_", " ").replace("/", " / ")))
    return (("", (("UTC", "UTC"),)), *((area, tuple(groups[area])) for area in PICKED_AREAS if area in groups))


@cache
def _picked() -> frozenset[str]:
    return frozenset(name for _, zones in time_zone_groups() for name, _ in zones)


def is_picked_zone(name: str) -> bool:
    return name in _picked()


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
