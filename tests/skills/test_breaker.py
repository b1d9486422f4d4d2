"""The circuit breakers: only outages count; a user's own circuit opens after consecutive
outages and answers at once while open; the skill's circuit for everyone opens only when
several users see outages; after the cool-down exactly one trial goes through, and its
success closes the circuit.

No tenant can disable a skill for others (issue 18): before, five calls with an absurd
date from one user opened the calendar skill's circuit for every user.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestration.models import SkillExecution
from skills.base import Skill, SkillError
from skills.breaker import breaker_admit, breaker_record
from skills.models import CalendarEvent, SkillCircuit
from tests.conftest import make_user

PARAMS = {
    "type": "object",
    "properties": {"fail": {"type": "string", "enum": ["outage", "transient", "not_found", "bug"]}},
    "additionalProperties": False,
}
ABSURD = {"title": "Forever", "start": "9999-12-31T23:59", "duration_minutes": 10080}


@pytest.fixture(autouse=True)
def breaker_settings(settings):
    settings.SKILLS_BREAKER_THRESHOLD = 2
    settings.SKILLS_BREAKER_COOLDOWN_SECONDS = 60
    settings.SKILLS_BREAKER_USERS = 2


@pytest.fixture
def runs(register):
    """Calls of testing.fragile that reached its handler; `fail` picks how it fails."""
    runs = []

    def handler(user, *, fail=None):
        runs.append(fail)
        if fail == "outage":
            raise ConnectionRefusedError("backend down")  # an OSError: the outside service
        if fail == "transient":
            raise SkillError("try later", permanent=False)
        if fail == "not_found":
            raise SkillError("task 9 not found")
        if fail == "bug":
            raise ValueError("year 10000 is out of range")  # what bad input sets off
        return {"fine": True}

    register(
        Skill(
            name="testing.fragile",
            description="Fails on demand.",
            parameters=PARAMS,
            handler=handler,
        )
    )
    return runs


@pytest.fixture
def carol(db):
    return make_user("carol")


def circuit(user=None) -> SkillCircuit:
    """The user's own circuit of testing.fragile; without a user, the one for everyone."""
    return SkillCircuit.objects.get(skill="testing.fragile", owner=user)


def cool_down_passes() -> None:
    SkillCircuit.objects.filter(skill="testing.fragile").update(
        opened_until=timezone.now() - timedelta(seconds=1)
    )


def test_opens_after_consecutive_outages_and_answers_at_once(call, runs, alice):
    assert call("testing.fragile", {"fail": "outage"}).error_kind == "failed"
    assert circuit(alice).opened_until is None
    call("testing.fragile", {"fail": "transient"})
    assert circuit(alice).consecutive_failures == 2 and circuit(alice).opened_until > timezone.now()

    refused = call("testing.fragile", {})
    assert runs == ["outage", "transient"]  # the third call never reached the handler
    assert (refused.status, refused.error_kind, refused.retryable) == (
        "failed",
        "unavailable",
        True,
    )
    assert refused.error == (
        "skill testing.fragile is temporarily unavailable after repeated failures of your calls; "
        "retry after 60 s"
    )
    row = SkillExecution.objects.get(pk=refused.execution_id)
    assert (row.status, row.result["error_kind"]) == ("failed", "unavailable")


def test_timeouts_count_as_outages(call, register):
    register(
        Skill(
            name="testing.slow",
            description="Sleeps.",
            parameters={
                "type": "object",
                "properties": {},
                "additionalProperties": False,
            },
            handler=lambda user: time.sleep(5),
            timeout=0.05,
        )
    )
    call("testing.slow", {})
    call("testing.slow", {})
    assert call("testing.slow", {}).error_kind == "unavailable"


def test_a_success_resets_the_count(call, runs, alice):
    call("testing.fragile", {"fail": "outage"})
    call("testing.fragile", {})
    call("testing.fragile", {"fail": "outage"})
    assert circuit(alice).consecutive_failures == 1 and circuit(alice).opened_until is None


@pytest.mark.parametrize(
    "arguments",
    [{"fail": "not_found"}, {"fail": "nonsense"}, {"fail": "bug"}],
    ids=["permanent", "invalid", "exception from bad input"],
)
def test_callers_mistakes_do_not_count(call, runs, arguments):
    """A "not found", a bad argument or a bug it sets off says nothing about the skill's
    health: none is counted, on anyone's circuit."""
    for _ in range(5):
        assert not call("testing.fragile", arguments).ok
    assert not SkillCircuit.objects.filter(consecutive_failures__gt=0).exists()
    assert call("testing.fragile", {}).ok


def test_callers_mistakes_do_not_reset_an_outage_count_either(call, runs, alice):
    """Only a completed call shows the skill works: bad calls between outages cannot keep
    a circuit closed while the outside service is down."""
    call("testing.fragile", {"fail": "outage"})
    call("testing.fragile", {"fail": "not_found"})
    call("testing.fragile", {"fail": "bug"})
    assert circuit(alice).consecutive_failures == 1
    call("testing.fragile", {"fail": "outage"})
    assert call("testing.fragile", {}).error_kind == "unavailable"


def test_absurd_dates_from_one_user_leave_the_calendar_working_for_everyone(call, alice, bob, settings):
    """The abuse of issue 18, with the product's threshold: five calls with an absurd date
    used to open calendar.create_event's circuit for every user."""
    settings.SKILLS_BREAKER_THRESHOLD = 5
    for _ in range(5):
        outcome = call("calendar.create_event", ABSURD, user=alice)
        assert (outcome.ok, outcome.error_kind) == (False, "failed")
        assert "out of range" in outcome.error and "unexpectedly" not in outcome.error
    assert call("calendar.create_event", ABSURD, user=alice).error_kind != "unavailable"
    assert not SkillCircuit.objects.exists()

    lunch = call("calendar.create_event", {"title": "Lunch", "start": "2026-12-01T12:00"}, user=bob)
    assert lunch.ok, lunch
    assert list(CalendarEvent.objects.values_list("owner__username", "title")) == [("bob", "Lunch")]


def test_one_users_outages_open_only_their_own_circuit(call, runs, alice, bob):
    for _ in range(3):
        call("testing.fragile", {"fail": "outage"}, user=alice)
    assert call("testing.fragile", {}, user=alice).error_kind == "unavailable"
    assert runs == ["outage", "outage"]

    assert call("testing.fragile", {}, user=bob).ok  # bob's calls go through
    assert circuit().opened_until is None  # the circuit for everyone stays closed
    assert call("testing.fragile", {}, user=alice).error_kind == "unavailable"  # bob cannot reopen it


def test_outages_seen_by_several_users_open_the_circuit_for_everyone(call, runs, alice, bob, carol):
    call("testing.fragile", {"fail": "outage"}, user=alice)
    call("testing.fragile", {"fail": "outage"}, user=bob)
    assert circuit().opened_until > timezone.now()

    refused = call("testing.fragile", {}, user=carol)  # carol never failed
    assert refused.error_kind == "unavailable"
    assert refused.error.startswith("skill testing.fragile is temporarily unavailable after repeated failures;")
    assert runs == ["outage", "outage"]


def test_an_everyone_circuit_whose_trial_fails_opens_again(call, runs, alice, bob, carol):
    call("testing.fragile", {"fail": "outage"}, user=alice)
    call("testing.fragile", {"fail": "outage"}, user=bob)
    cool_down_passes()
    assert call("testing.fragile", {"fail": "outage"}, user=carol).error_kind == "failed"
    assert circuit().opened_until > timezone.now() + timedelta(seconds=50)
    assert call("testing.fragile", {}, user=carol).error_kind == "unavailable"


def test_after_the_cool_down_exactly_one_trial_goes_through(runs, call, alice):
    call("testing.fragile", {"fail": "outage"})
    call("testing.fragile", {"fail": "outage"})
    cool_down_passes()
    assert breaker_admit(skill="testing.fragile", user=alice).retry_after is None  # the trial
    assert breaker_admit(skill="testing.fragile", user=alice).retry_after == 60  # the rest wait


def test_a_successful_trial_closes_the_circuit(call, runs, alice):
    call("testing.fragile", {"fail": "outage"})
    call("testing.fragile", {"fail": "outage"})
    cool_down_passes()
    assert call("testing.fragile", {}).ok
    assert (circuit(alice).consecutive_failures, circuit(alice).opened_until) == (0, None)
    assert call("testing.fragile", {}).ok


def test_a_failed_trial_opens_it_again(call, runs, alice):
    call("testing.fragile", {"fail": "outage"})
    call("testing.fragile", {"fail": "outage"})
    cool_down_passes()
    assert call("testing.fragile", {"fail": "outage"}).error_kind == "failed"
    assert circuit(alice).opened_until > timezone.now() + timedelta(seconds=50)
    assert call("testing.fragile", {}).error_kind == "unavailable"
    assert runs == ["outage", "outage", "outage"]


def test_breakers_are_per_skill(alice, bob):
    for user in (alice, bob):
        breaker_record(skill="tasks.create", user=user, healthy=False)
        breaker_record(skill="tasks.create", user=user, healthy=False)
    assert breaker_admit(skill="tasks.create", user=alice).retry_after == 60
    assert breaker_admit(skill="tasks.search", user=alice).retry_after is None


def test_a_deleted_user_takes_their_circuits_along(alice, bob):
    breaker_record(skill="tasks.create", user=alice, healthy=False)
    alice.delete()
    assert list(SkillCircuit.objects.values_list("skill", "owner")) == [("tasks.create", None)]
