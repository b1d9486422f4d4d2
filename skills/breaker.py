"""A circuit breaker per skill, kept in the SkillCircuit table so every worker shares it.

closed → (SKILLS_BREAKER_THRESHOLD consecutive failures) → open for
SKILLS_BREAKER_COOLDOWN_SECONDS → half-open: exactly one trial call is let through,
claimed with a conditional UPDATE that pushes the open window forward, so concurrent
callers keep being refused while it runs. Its success closes the circuit; its failure
opens it again. All counting is done with F() expressions: no read-modify-write races.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from skills.models import SkillCircuit


def breaker_admit(*, skill: str) -> int | None:
    """None if the call may run now; otherwise the whole seconds until the next trial."""
    circuit = SkillCircuit.objects.filter(skill=skill).first()
    if circuit is None or circuit.opened_until is None:
        return None
    now = timezone.now()
    if circuit.opened_until <= now:
        claimed = SkillCircuit.objects.filter(
            skill=skill, opened_until=circuit.opened_until
        ).update(opened_until=now + _cooldown(), updated_at=now)
        if claimed:
            return None  # this call is the half-open trial
        circuit.refresh_from_db()
        if circuit.opened_until is None:
            return None  # another trial closed it meanwhile
    return max(1, math.ceil((circuit.opened_until - now).total_seconds()))


def breaker_record(*, skill: str, healthy: bool) -> None:
    """Count one finished call: a healthy one closes the circuit, a failure may open it."""
    now = timezone.now()
    if healthy:
        SkillCircuit.objects.filter(
            Q(consecutive_failures__gt=0) | Q(opened_until__isnull=False), skill=skill
        ).update(consecutive_failures=0, opened_until=None, updated_at=now)
        return
    SkillCircuit.objects.get_or_create(skill=skill)
    SkillCircuit.objects.filter(skill=skill).update(
        consecutive_failures=F("consecutive_failures") + 1, updated_at=now
    )
    SkillCircuit.objects.filter(
        skill=skill, consecutive_failures__gte=settings.SKILLS_BREAKER_THRESHOLD
    ).update(opened_until=now + _cooldown())


def _cooldown() -> timedelta:
    return timedelta(seconds=settings.SKILLS_BREAKER_COOLDOWN_SECONDS)
