"""Circuit breakers, kept in the SkillCircuit table so every worker shares them.

What counts. Only a failure of the skill's infrastructure: a timeout, a transient
SkillError (a mail server that is down), or an exception the skill names as its
outside service failing (`Skill.outage_errors`, OSError by default: connection errors,
socket timeouts, smtplib's errors). A refusal of bad arguments, a permanent SkillError
("task 12 not found", a date out of range) or any other exception raised while handling
what a user or a model sent says nothing about the skill's health, so it is not counted
at all (nor does it reset anything: only a completed call proves the skill works).

Whose circuit. Even an infrastructure failure may be one user's own doing (a query over
their own huge data that times out), so every failure is counted on the circuit of
(skill, user), which opens for that user alone after SKILLS_BREAKER_THRESHOLD failures
in a row. The skill's circuit for everyone (the row without a user) counts the same
failures from all users, but opens only when, besides reaching the threshold, at least
SKILLS_BREAKER_USERS distinct users saw failures within SKILLS_BREAKER_WINDOW_SECONDS:
an outside service that is really down fails for everyone, while one tenant (or a
handful) cannot switch a skill off for the others. Any user's completed call closes the
everyone-circuit and their own; it cannot close another user's own circuit.

Each circuit: closed → (threshold reached) → open for SKILLS_BREAKER_COOLDOWN_SECONDS →
half-open: exactly one trial call is let through, claimed with a conditional UPDATE
that pushes the open window forward, so concurrent callers keep being refused while it
runs. Its success closes the circuit; its outage opens it again; a trial that ends in
the caller's mistake proves nothing, and the next caller after another cool-down tries.
All counting is done with F() expressions: no read-modify-write races.

A clean admission is remembered by the process for CLEAN_SECONDS (`breaker_clean`, which
the engine's read-only calls ask on every step): failures counted by another process
are seen that much later, failures counted here at once.
"""

from __future__ import annotations

import math
import time
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
    everyone: bool = False  # refused by the skill's circuit for everyone (not the user's own)


def breaker_admit(*, skill: str, user) -> Admission:
    """May `user` call `skill` now? The user's own circuit is asked first, so that a user
    refused by it does not use up the everyone-circuit's trial call."""
    rows = {row.owner_id: row for row in SkillCircuit.objects.filter(
        Q(owner__isnull=True) | Q(owner_id=_owner_id(user)), skill=skill)}
    clean = True
    for owner_id in dict.fromkeys((_owner_id(user), None)):
        admitted = _admit(rows.get(owner_id))
        if admitted.retry_after is not None:
            return Admission(admitted.retry_after, clean=False, everyone=owner_id is None)
        clean = clean and admitted.clean
    return Admission(None, clean=clean)


CLEAN_SECONDS = 5.0
_clean_until: dict[tuple[str, int | None], float] = {}


def breaker_clean(*, skill: str, user) -> bool:
    """Whether both of the call's circuits are clean (no failure counted): such a call
    may run without anything to reset after. Remembered for CLEAN_SECONDS."""
    key = (skill, _owner_id(user))
    if _clean_until.get(key, 0.0) > time.monotonic():
        return True
    admitted = breaker_admit(skill=skill, user=user)
    if admitted.retry_after is None and admitted.clean:
        _clean_until[key] = time.monotonic() + CLEAN_SECONDS
        return True
    return False


def breaker_forget() -> None:
    """Forget the clean admissions remembered (a failure was counted; tests)."""
    _clean_until.clear()


def breaker_record(*, skill: str, user, healthy: bool) -> None:
    """Count one finished call that says something about the skill's health: a
    completed one (`healthy`) closes the user's and the everyone-circuit, an
    infrastructure failure counts on both and may open either.

    (The executor skips a healthy call's record when both circuits were clean as it was
    admitted: a failure counted meanwhile by another worker is reset by the next one.)"""
    now = timezone.now()
    owner_id = _owner_id(user)
    if not healthy:
        breaker_forget()
    mine = Q(owner_id=owner_id) if owner_id is not None else Q(pk__in=[])
    both = SkillCircuit.objects.filter(mine | Q(owner__isnull=True), skill=skill)
    if healthy:
        both.filter(Q(consecutive_failures__gt=0) | Q(opened_until__isnull=False)).update(
            consecutive_failures=0, opened_until=None, updated_at=now
        )
        return
    if owner_id is not None:
        SkillCircuit.objects.get_or_create(skill=skill, owner_id=owner_id)
    SkillCircuit.objects.get_or_create(skill=skill, owner=None)
    both.update(consecutive_failures=F("consecutive_failures") + 1, updated_at=now)
    threshold = settings.SKILLS_BREAKER_THRESHOLD
    if owner_id is not None:
        SkillCircuit.objects.filter(
            skill=skill, owner_id=owner_id, consecutive_failures__gte=threshold
        ).update(opened_until=now + _cooldown())
    everyone = SkillCircuit.objects.filter(skill=skill, owner=None, consecutive_failures__gte=threshold)
    if (everyone.filter(opened_until__isnull=False).exists()
            or _failing_users(skill, now) >= settings.SKILLS_BREAKER_USERS):
        # Already open (a trial that failed) or failing for enough users: open for everyone.
        everyone.update(opened_until=now + _cooldown())


def _admit(circuit: SkillCircuit | None) -> Admission:
    if circuit is None or (circuit.opened_until is None and not circuit.consecutive_failures):
        return Admission(None, clean=True)
    if circuit.opened_until is None:
        return Admission(None, clean=False)
    now = timezone.now()
    if circuit.opened_until <= now:
        claimed = SkillCircuit.objects.filter(
            pk=circuit.pk, opened_until=circuit.opened_until
        ).update(opened_until=now + _cooldown(), updated_at=now)
        if claimed:
            return Admission(None, clean=False)  # this call is the half-open trial
        circuit.refresh_from_db()
        if circuit.opened_until is None:
            return Admission(None, clean=False)  # another trial closed it meanwhile
    return Admission(max(1, math.ceil((circuit.opened_until - now).total_seconds())), clean=False)


def _failing_users(skill: str, now) -> int:
    """Users whose own circuit of `skill` counts failures, the last one recent."""
    since = now - timedelta(seconds=settings.SKILLS_BREAKER_WINDOW_SECONDS)
    return SkillCircuit.objects.filter(
        skill=skill, owner__isnull=False, consecutive_failures__gt=0, updated_at__gte=since
    ).count()


def _owner_id(user) -> int | None:
    return getattr(user, "pk", None)


def _cooldown() -> timedelta:
    return timedelta(seconds=settings.SKILLS_BREAKER_COOLDOWN_SECONDS)
