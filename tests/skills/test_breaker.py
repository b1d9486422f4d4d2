"""The circuit breaker: opens after consecutive failures, answers at once while open,
lets exactly one trial through after the cool-down, and closes on its success."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestration.models import SkillExecution
from skills.base import Skill, SkillError
from skills.breaker import breaker_admit, breaker_record
from skills.models import SkillCircuit

PARAMS = {
    "type": "object",
    "properties": {"fail": {"type": "string", "enum": ["crash", "transient", "not_found"]}},
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def breaker_settings(settings):
    settings.SKILLS_BREAKER_THRESHOLD = 2
    settings.SKILLS_BREAKER_COOLDOWN_SECONDS = 60


@pytest.fixture
def runs(register):
    """Calls of testing.fragile that reached its handler; `fail` picks how it fails."""
    runs = []

    def handler(user, *, fail=None):
        runs.append(fail)
        if fail == "crash":
            raise RuntimeError("backend down")
        if fail == "transient":
            raise SkillError("try later", permanent=False)
        if fail == "not_found":
            raise SkillError("task 9 not found")
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


def circuit() -> SkillCircuit:
    return SkillCircuit.objects.get(skill="testing.fragile")


def cool_down_passes() -> None:
    SkillCircuit.objects.filter(skill="testing.fragile").update(
        opened_until=timezone.now() - timedelta(seconds=1)
    )


def test_opens_after_consecutive_failures_and_answers_at_once(call, runs):
    assert call("testing.fragile", {"fail": "crash"}).error_kind == "failed"
    assert circuit().opened_until is None
    call("testing.fragile", {"fail": "transient"})
    assert circuit().consecutive_failures == 2 and circuit().opened_until > timezone.now()

    refused = call("testing.fragile", {})
    assert runs == ["crash", "transient"]  # the third call never reached the handler
    assert (refused.status, refused.error_kind, refused.retryable) == (
        "failed",
        "unavailable",
        True,
    )
    assert refused.error == (
        "skill testing.fragile is temporarily unavailable after repeated failures; retry after 60 s"
    )
    row = SkillExecution.objects.get(pk=refused.execution_id)
    assert (row.status, row.result["error_kind"]) == ("failed", "unavailable")


def test_timeouts_count_as_failures(call, register):
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


def test_a_success_resets_the_count(call, runs):
    call("testing.fragile", {"fail": "crash"})
    call("testing.fragile", {})
    call("testing.fragile", {"fail": "crash"})
    assert circuit().consecutive_failures == 1 and circuit().opened_until is None


@pytest.mark.parametrize(
    "arguments", [{"fail": "not_found"}, {"fail": "nonsense"}], ids=["permanent", "invalid"]
)
def test_callers_mistakes_do_not_count(call, runs, arguments):
    """A "not found" or a bad argument says nothing about the skill's health."""
    for _ in range(3):
        call("testing.fragile", arguments)
    assert not SkillCircuit.objects.filter(consecutive_failures__gt=0).exists()


def test_after_the_cool_down_exactly_one_trial_goes_through(runs, call):
    call("testing.fragile", {"fail": "crash"})
    call("testing.fragile", {"fail": "crash"})
    cool_down_passes()
    assert breaker_admit(skill="testing.fragile").retry_after is None  # this caller holds the trial
    assert breaker_admit(skill="testing.fragile").retry_after == 60  # everyone else keeps waiting


def test_a_successful_trial_closes_the_circuit(call, runs):
    call("testing.fragile", {"fail": "crash"})
    call("testing.fragile", {"fail": "crash"})
    cool_down_passes()
    assert call("testing.fragile", {}).ok
    assert (circuit().consecutive_failures, circuit().opened_until) == (0, None)
    assert call("testing.fragile", {}).ok


def test_a_failed_trial_opens_it_again(call, runs):
    call("testing.fragile", {"fail": "crash"})
    call("testing.fragile", {"fail": "crash"})
    cool_down_passes()
    assert call("testing.fragile", {"fail": "crash"}).error_kind == "failed"
    assert circuit().opened_until > timezone.now() + timedelta(seconds=50)
    assert call("testing.fragile", {}).error_kind == "unavailable"
    assert runs == ["crash", "crash", "crash"]


def test_breakers_are_per_skill(db):
    breaker_record(skill="tasks.create", healthy=False)
    breaker_record(skill="tasks.create", healthy=False)
    assert breaker_admit(skill="tasks.create").retry_after == 60
    assert breaker_admit(skill="tasks.search").retry_after is None
