"""Skills read and show times in the zone of the turn they run for (execute_skill's
`time_zone`): a date without an offset is the user's wall clock, "today" is the user's
today, and results carry the user's offset. Without one, the server's zone (UTC here).

Los Angeles is west of UTC (UTC-08:00 in November), Tokyo east (UTC+09:00)."""

from __future__ import annotations

import asyncio
import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from skills.base import Skill
from skills.domains.calendar.models import CalendarEvent
from skills.executor import execute_skill
from skills.models import Task

pytestmark = pytest.mark.django_db(transaction=True)  # some calls run on other threads

WEST, EAST = "America/Los_Angeles", "Asia/Tokyo"
UTC = dt.timezone.utc
NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


@pytest.mark.parametrize(("zone", "utc", "shown"), [
    (WEST, "2026-11-25T22:00:00+00:00", "2026-11-25T14:00:00-08:00"),
    (EAST, "2026-11-25T05:00:00+00:00", "2026-11-25T14:00:00+09:00"),
    ("", "2026-11-25T14:00:00+00:00", "2026-11-25T14:00:00+00:00"),  # a turn from before zones: the server's
    (None, "2026-11-25T14:00:00+00:00", "2026-11-25T14:00:00+00:00"),  # outside a turn: the server's
])
def test_a_time_without_an_offset_is_the_users_wall_clock(ok, zone, utc, shown):
    data = ok("calendar.create_event", {"title": "Review", "start": "2026-11-25T14:00:00"}, time_zone=zone)
    assert CalendarEvent.objects.get().start == at(utc)
    assert data["event"]["start"] == shown


def test_a_time_with_an_offset_is_that_instant_shown_on_the_users_clock(ok):
    data = ok("calendar.create_event", {"title": "Call", "start": "2026-11-25T14:00:00+01:00"}, time_zone=EAST)
    assert CalendarEvent.objects.get().start == at("2026-11-25T13:00:00+00:00")
    assert data["event"]["start"] == "2026-11-25T22:00:00+09:00"


@pytest.mark.parametrize(("zone", "now", "overdue"), [
    # 05:30 UTC on the 25th is still the 24th in Los Angeles: due today, not overdue
    (WEST, "2026-11-25T05:30:00+00:00", False),
    (None, "2026-11-25T05:30:00+00:00", True),
    # 20:00 UTC on the 24th is already the 25th in Tokyo: due yesterday, overdue
    (EAST, "2026-11-24T20:00:00+00:00", True),
    (None, "2026-11-24T20:00:00+00:00", False),
])
def test_today_is_the_users_today(ok, alice, monkeypatch, zone, now, overdue):
    monkeypatch.setattr(timezone, "now", lambda: at(now))
    Task.objects.create(owner=alice, title="Renew passport", due=dt.date(2026, 11, 24))
    found = ok("tasks.search", {"status": "open", "overdue": True}, time_zone=zone)["tasks"]
    assert bool(found) is overdue


def test_the_zone_is_active_only_while_the_handler_runs(call, register):
    seen = []
    register(Skill(name="testing.clock", description="Which zone is active.", parameters=NO_PARAMS,
                   handler=lambda user: seen.append(timezone.get_current_timezone_name()) or {}))
    call("testing.clock", {}, time_zone=EAST)
    assert seen == [EAST] and timezone.get_current_timezone_name() == "UTC"


def test_a_nested_call_runs_in_its_outer_calls_zone(call, register, alice):
    seen = []

    def outer(user):
        inner = execute_skill(name="calendar.create_event", arguments={"title": "Nested", "start": "2026-11-25T09:00"},
                              user=user, tool_call_id="inner")
        seen.append(timezone.get_current_timezone_name())
        return {"inner": inner.data}

    register(Skill(name="testing.outer", description="Books an event itself.", parameters=NO_PARAMS, handler=outer))
    data = call("testing.outer", {}, time_zone=WEST).data
    assert seen == [WEST]
    assert CalendarEvent.objects.get(title="Nested").start == at("2026-11-25T17:00:00+00:00")
    assert data["inner"]["event"]["start"] == "2026-11-25T09:00:00-08:00"


def _book(dispatch, tool_call_id: str) -> dt.datetime:
    outcome = execute_skill(name="calendar.create_event", arguments={"title": tool_call_id, "start": "2026-11-25T14:00"},
                            user=dispatch.turn.conversation.owner, tool_call_id=tool_call_id,
                            scope={"dispatch": dispatch}, time_zone=EAST)
    assert outcome.ok, outcome
    return CalendarEvent.objects.get(title=tool_call_id).start


def test_every_path_a_skill_runs_on_gets_the_zone(dispatch):
    """Inline (tests, `ask --sync`), on a runner's database thread (a qcluster worker),
    and through sync_to_async from a coroutine (orchestration/delivery/runner.py `db`): the zone
    is set where the handler runs, whatever thread that is."""
    with ThreadPoolExecutor(1) as pool:
        on_a_thread = pool.submit(_book, dispatch, "runner-thread").result()
    from_a_coroutine = asyncio.run(sync_to_async(_book, thread_sensitive=True)(dispatch, "coroutine"))
    inline = _book(dispatch, "inline")
    assert {on_a_thread, from_a_coroutine, inline} == {dt.datetime(2026, 11, 25, 14, tzinfo=ZoneInfo(EAST))}
