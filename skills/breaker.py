"""A circuit breaker per skill, kept in the SkillCircuit table so every worker shares it.

closed → (SKILLS_BREAKER_THRESHOLD consecutive failures) → open for
SKILLS_BREAKER_COOLDOWN_SECONDS → half-open: exactly one trial call is let through,
claimed with a conditional UPDATE that pushes the open window forward, so concurrent
callers keep being refused while it runs. Its success closes the circuit; its failure
opens it again. All counting is done with F() expressions: no read-modify-write races.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from skills.models import SkillCircuit


@dataclass(frozen=True)
class Admission:
    retry_after: int | None  # None: the call may run now; else whole seconds until the next trial
    clean: bool  # no failure counted: a healthy result has nothing to reset


def breaker_admit(*, skill: str) -> Admission:
    circuit = SkillCircuit.objects.filter(skill=skill).first()
    if circuit is None or (circuit.opened_until is None and not circuit.consecutive_failures):
        return Admission(None, clean=True)
    if circuit.opened_until is None:
        return Admission(None, clean=False)
    now = timezone.now()
    if circuit.opened_until <= now:
        claimed = SkillCircuit.objects.filter(
            skill=skill, opened_until=circuit.opened_until
        ).update(opened_until=now + _cooldown(), updated_at=now)
        if claimed:
            return Admission(None, clean=False)  # this call is the half-open trial
        circuit.refresh_from_db()
        if circuit.opened_until is None:
            return Admission(None, clean=False)  # another trial closed it meanwhile
    return Admission(max(1, math.ceil((circuit.opened_until - now).total_seconds())), clean=False)


def breaker_record(*, skill: str, healthy: bool) -> None:
    """Count one finished call: a healthy one closes the circuit, a failure may open it.

    (The executor skips a healthy call's record when the circuit was clean as it was
    admitted: a failure counted meanwhile by another worker is reset by the next one.)"""
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
