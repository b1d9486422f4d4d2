"""Time as the user means it (issue 15): a turn keeps its owner's time zone; the prompts
end with the user's local date and time of the request; "tomorrow at 2pm" is booked at
14:00 on the user's clock, the day after the user's today, whatever the date in UTC.

Each case starts the turn at a moment when the user's calendar day is not UTC's:
05:30 UTC on Wednesday the 25th is still Tuesday evening in Los Angeles (west of UTC),
20:00 UTC on Tuesday the 24th is already Wednesday morning in Tokyo (east). The turn's
start is set before its first step runs (`queued`), so nothing depends on the clock."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from assistant.models import Preferences
from orchestration.models import AgentDispatch, SkillExecution, Turn
from orchestration.engine.prompts import user_local_time
from orchestration.lifecycle.turns import turn_start
from skills.domains.calendar.models import CalendarEvent
from tests.factories import conversation_for
from tests.support.llm_server import Agent, Plan

pytestmark = pytest.mark.django_db(transaction=True)

SEED = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


WEST = {
    "zone": "America/Los_Angeles", "started": at("2026-11-25T05:30:00+00:00"),
    "line": "The user's local time: Tuesday 2026-11-24 21:30 (America/Los_Angeles, UTC-08:00).",
    "tomorrow_2pm": "2026-11-25T14:00:00", "booked": at("2026-11-25T22:00:00+00:00"),
    "shown": "2026-11-25T14:00:00-08:00",
}
EAST = {
    "zone": "Asia/Tokyo", "started": at("2026-11-24T20:00:00+00:00"),
    "line": "The user's local time: Wednesday 2026-11-25 05:00 (Asia/Tokyo, UTC+09:00).",
    "tomorrow_2pm": "2026-11-26T14:00:00", "booked": at("2026-11-26T05:00:00+00:00"),
    "shown": "2026-11-26T14:00:00+09:00",
}
USERS = pytest.mark.parametrize("where", [WEST, EAST], ids=["west", "east"])


def lives_in(user, zone: str):
    Preferences.objects.create(user=user, time_zone=zone)
    return user


@pytest.fixture
def ask_at(queued):
    """`ask_at(user, text, started)`: a turn started at `started` (UTC), run to the end."""

    def ask(user, text: str, started: dt.datetime) -> Turn:
        turn = turn_start(conversation=conversation_for(user), text=text)
        Turn.objects.filter(pk=turn.pk).update(started_at=started)
        queued()
        turn.refresh_from_db()
        assert turn.status == "completed", turn.error
        return turn

    return ask


# --- the turn's zone ---------------------------------------------------------------------


def test_a_turn_keeps_the_zone_its_owner_had_when_it_started(inline_tasks, alice):
    lives_in(alice, "Asia/Tokyo")
    turn = turn_start(conversation=conversation_for(alice), text="hello")
    Preferences.objects.filter(user=alice).update(time_zone="Europe/Paris")
    turn.refresh_from_db()
    assert turn.time_zone == "Asia/Tokyo"


def test_an_owner_without_a_zone_gets_the_servers(inline_tasks, alice, settings):
    settings.TIME_ZONE = "Europe/Lisbon"
    assert turn_start(conversation=conversation_for(alice), text="hello").time_zone == "Europe/Lisbon"


# --- the prompt line ---------------------------------------------------------------------


@USERS
def test_the_local_time_line_gives_the_users_date_time_and_offset(where):
    turn = Turn(time_zone=where["zone"], started_at=where["started"])
    assert user_local_time(turn) == where["line"]


def test_the_local_time_line_follows_daylight_saving():
    summer = Turn(time_zone="America/Los_Angeles", started_at=at("2026-07-01T19:05:00+00:00"))
    assert user_local_time(summer) == "The user's local time: Wednesday 2026-07-01 12:05 (America/Los_Angeles, UTC-07:00)."


def test_a_turn_from_before_zones_gets_the_servers_time(settings):
    settings.TIME_ZONE = "UTC"
    turn = Turn(time_zone="", started_at=at("2026-11-25T05:30:00+00:00"))
    assert user_local_time(turn) == "The user's local time: Wednesday 2026-11-25 05:30 (UTC, UTC+00:00)."


# --- "tomorrow at 2pm" -------------------------------------------------------------------


@USERS
def test_the_offline_planner_books_tomorrow_at_2pm_on_the_users_clock(ask_at, alice, where):
    ask_at(lives_in(alice, where["zone"]), SEED, where["started"])

    meeting = AgentDispatch.objects.get(agent_id="book-meeting")
    assert f'"start": "{where["tomorrow_2pm"]}"' in meeting.context  # naive, as a model writes it
    assert CalendarEvent.objects.get(owner=alice).start == where["booked"]
    execution = SkillExecution.objects.get(skill="calendar.create_event")
    assert execution.result["event"]["start"] == where["shown"]


@USERS
def test_a_scripted_model_planning_from_the_prompt_books_the_right_instant(llm, ask_at, alice, where):
    """The model reads the date in the prompt and writes a naive local time, as real
    models do; the prompts carry the same line on every call of the turn."""
    meeting = ("calendar.create_event", {"title": "Review meeting", "start": where["tomorrow_2pm"]})
    llm.respond = Plan([Agent("meeting", ["calendar.create_event"], [meeting], report="Booked.")],
                       answer="Booked.", discover=False)

    ask_at(lives_in(alice, where["zone"]), SEED, where["started"])

    assert CalendarEvent.objects.get(owner=alice).start == where["booked"]
    agent = [r for r in llm.requests if "use_skill" in {t["function"]["name"] for t in r.get("tools", [])}]
    orchestrator = [r for r in llm.requests if r not in agent]
    for requests, calls in ((orchestrator, 3), (agent, 2)):
        prompts = {request["messages"][0]["content"] for request in requests}
        assert len(requests) == calls and len(prompts) == 1  # byte-identical on every call
        assert prompts.pop().endswith("\n\n" + where["line"])  # last, after the static part
    # what the agent read back is on the user's clock too
    result = json.loads(agent[-1]["messages"][-1]["content"])
    assert result["result"]["event"]["start"] == where["shown"]
