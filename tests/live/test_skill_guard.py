"""No tenant can disable a skill for others, on a real qcluster (issue 18).

Before: five calls with an absurd date from one user opened the calendar skill's circuit
breaker for every user. Now alice's agent gets five clear refusals, no circuit counts
anything, and bob's calendar turn goes on as before. Bob's turn time is measured before
and after alice's in the same run and printed, not asserted.
"""

from __future__ import annotations

import time

import pytest

from orchestration.models import SkillExecution
from orchestration.lifecycle.turns import turn_start
from skills.models import CalendarEvent, SkillCircuit
from tests.factories import conversation_for
from tests.live.test_qcluster import wait_turn
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ABSURD = ("calendar.create_event", {"title": "Forever", "start": "9999-12-31T23:59", "duration_minutes": 10080})
LUNCH = ("calendar.create_event", {"title": "Lunch with Sam", "start": "2026-12-01T12:00"})


def timed_turn(llm, cluster, user, agent: Agent):
    llm.respond = Plan([agent])
    started = time.monotonic()
    turn = turn_start(conversation=conversation_for(user), text="Put it in my calendar")
    wait_turn(turn, cluster)
    return turn, time.monotonic() - started


def test_absurd_dates_from_alice_leave_bobs_calendar_working(llm, qcluster, alice, bob):
    cluster = qcluster(workers=2)  # the product's breaker: 5 failures in a row
    booker = Agent("booker", ["calendar.create_event"], [LUNCH])
    bob_first, before = timed_turn(llm, cluster, bob, booker)
    assert bob_first.status == "completed", bob_first.error

    abuser = Agent("abuser", ["calendar.create_event"], [ABSURD] * 5, extra={"max_tool_calls": 6})
    alice_turn, _ = timed_turn(llm, cluster, alice, abuser)
    assert alice_turn.status == "completed", alice_turn.error
    errors = list(SkillExecution.objects.filter(dispatch__turn=alice_turn).values_list("status", "error"))
    assert len(errors) == 5
    assert all(status == "failed" and error.startswith("'start' is out of range") for status, error in errors), errors
    assert not SkillCircuit.objects.exists()

    bob_again, after = timed_turn(llm, cluster, bob, booker)
    assert bob_again.status == "completed", bob_again.error
    assert SkillExecution.objects.get(dispatch__turn=bob_again).status == "completed"
    assert list(CalendarEvent.objects.values_list("owner__username", flat=True)) == ["bob", "bob"]
    assert llm.errors == []
    print(f"\nbob's calendar turn: {before:.2f} s before alice's five absurd dates, {after:.2f} s after")
