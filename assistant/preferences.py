"""A user's time zone: validated and set.

Blank or unknown means settings.TIME_ZONE. Reading it is the engine's
(orchestration/zones.py), which snapshots the zone into each turn
(orchestration/lifecycle/turns.py), so skills and prompts read "tomorrow at 2pm" in it.
"""

from __future__ import annotations

from django.utils import timezone

from assistant.models import Preferences
from orchestration.zones import is_time_zone


class InvalidTimeZone(ValueError):
    """The name is not an IANA time zone this server knows."""


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
