"""calendar.*: list a range, create (reporting overlaps), cancel — per user."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from skills.models import CalendarEvent


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2030, 5, day, hour, minute, tzinfo=UTC)


def event(owner, title, start, minutes=60, **fields):
    return CalendarEvent.objects.create(
        owner=owner,
        title=title,
        start=start,
        duration_minutes=minutes,
        end=start + timedelta(minutes=minutes),
        **fields,
    )


@pytest.fixture
def events(alice, bob):
    return {
        "standup": event(alice, "Stand-up", at(6, 9), 15),
        "lunch": event(alice, "Lunch", at(6, 12)),
        "dropped": event(alice, "Dropped", at(6, 15), status="cancelled"),
        "next_week": event(alice, "Review", at(13, 10)),
        "bobs": event(bob, "Bob's meeting", at(6, 12)),
    }


def titles(result: dict, key: str = "events") -> list[str]:
    return [item["title"] for item in result[key]]


class TestListEvents:
    def test_events_overlapping_the_range(self, ok, events):
        # The stand-up started before the range but is still running in it.
        result = ok(
            "calendar.list_events",
            {"start": "2030-05-06T09:10:00+00:00", "end": "2030-05-07T00:00:00+00:00"},
        )
        assert titles(result) == ["Stand-up", "Lunch"] and result["total"] == 2
        assert result["events"][1] == {
            "id": events["lunch"].pk,
            "title": "Lunch",
            "start": "2030-05-06T12:00:00+00:00",
            "end": "2030-05-06T13:00:00+00:00",
            "duration_minutes": 60,
            "invitees": [],
            "status": "active",
        }

    def test_cancelled_on_request(self, ok, events):
        result = ok(
            "calendar.list_events",
            {"start": "2030-05-06", "end": "2030-05-07", "include_cancelled": True},
        )
        assert titles(result) == ["Stand-up", "Lunch", "Dropped"]

    def test_default_range_is_the_next_two_weeks(self, ok, alice):
        soon = event(alice, "Soon", timezone.now() + timedelta(days=3))
        event(alice, "Later", timezone.now() + timedelta(days=20))
        assert titles(ok("calendar.list_events", {})) == [soon.title]

    def test_a_backwards_or_huge_range_is_refused(self, call):
        backwards = call("calendar.list_events", {"start": "2030-05-07", "end": "2030-05-06"})
        assert backwards.error == "'end' must be after 'start'"
        huge = call("calendar.list_events", {"start": "2030-01-01", "end": "2032-01-01"})
        assert huge.error == "the range may span at most 366 days"

    def test_replay_answers_as_the_first_time(self, call, events, alice):
        arguments = {"start": "2030-05-06", "end": "2030-05-07"}
        first = call("calendar.list_events", arguments, tool_call_id="l1")
        event(alice, "Added since", at(6, 18))
        again = call("calendar.list_events", arguments, tool_call_id="l1")
        assert again.replayed and again.data == first.data and again.data["total"] == 2

    def test_bob_sees_only_his_own(self, ok, events, bob):
        result = ok("calendar.list_events", {"start": "2030-05-06", "end": "2030-05-07"}, user=bob)
        assert titles(result) == ["Bob's meeting"]


class TestCreateEvent:
    def test_creates_and_reports_overlaps(self, ok, events, alice):
        result = ok(
            "calendar.create_event",
            {
                "title": "Dentist",
                "start": "2030-05-06T12:30:00+00:00",
                "duration_minutes": 45,
                "invitees": ["dr@example.com"],
            },
        )
        created = CalendarEvent.objects.get(pk=result["event"]["id"])
        assert (created.owner, created.end, created.invitees) == (
            alice,
            at(6, 13, 15),
            ["dr@example.com"],
        )
        # Lunch overlaps; the cancelled event and Bob's meeting do not count.
        assert titles(result, "overlaps") == ["Lunch"]

    def test_no_overlap(self, ok, events):
        result = ok("calendar.create_event", {"title": "Gym", "start": "2030-05-06T07:00:00+00:00"})
        assert result["overlaps"] == [] and result["event"]["duration_minutes"] == 60

    def test_adjacent_events_do_not_overlap(self, ok, events):
        result = ok(
            "calendar.create_event",
            {"title": "Coffee", "start": "2030-05-06T13:00:00Z", "duration_minutes": 30},
        )
        assert result["overlaps"] == []

    def test_a_time_without_offset_is_in_the_server_time_zone(self, ok, settings):
        settings.TIME_ZONE = "Europe/Paris"
        result = ok("calendar.create_event", {"title": "Call", "start": "2030-05-06T10:00"})
        assert result["event"]["start"] == "2030-05-06T10:00:00+02:00"
        assert CalendarEvent.objects.get().start == at(6, 8)

    def test_replay_creates_one_event(self, call, alice):
        arguments = {"title": "Gym", "start": "2030-05-06T07:00:00+00:00"}
        first = call("calendar.create_event", arguments, tool_call_id="c1")
        again = call("calendar.create_event", arguments, tool_call_id="c1")
        assert again.replayed and again.data == first.data
        assert CalendarEvent.objects.count() == 1


class TestCancelEvent:
    def test_cancels_once(self, ok, events):
        result = ok("calendar.cancel_event", {"event_id": events["lunch"].pk})
        assert result["event"]["status"] == "cancelled" and not result["already_cancelled"]
        assert ok("calendar.cancel_event", {"event_id": events["lunch"].pk})["already_cancelled"]
        events["lunch"].refresh_from_db()
        assert events["lunch"].cancelled_at is not None

    def test_another_users_event_is_not_found(self, call, events):
        outcome = call("calendar.cancel_event", {"event_id": events["bobs"].pk})
        assert outcome.error == f"event {events['bobs'].pk} not found"
        events["bobs"].refresh_from_db()
        assert events["bobs"].status == "active"

    def test_replay(self, call, events):
        first = call("calendar.cancel_event", {"event_id": events["lunch"].pk}, tool_call_id="c")
        again = call("calendar.cancel_event", {"event_id": events["lunch"].pk}, tool_call_id="c")
        assert again.replayed and again.data == first.data


class TestProvenance:
    """An event an agent wrote from outside content is that content again when read
    back, in a list or as an overlap (skills/provenance.py); the owner's own are not."""

    def test_an_event_keeps_what_had_reached_its_writer_and_its_canceller(self, ok):
        created = ok("calendar.create_event", {"title": "Door", "start": "2030-05-06T07:00:00+00:00"},
                     outside=["file notes.txt"])["event"]
        assert created["written_from"] == ["file notes.txt"]
        ok("calendar.cancel_event", {"event_id": created["id"]}, outside=["email “Hi” (id 2)"])
        assert CalendarEvent.objects.get(pk=created["id"]).provenance == ["file notes.txt", "email “Hi” (id 2)"]

    def test_reading_it_back_is_outside_content(self, call, events):
        written = call("calendar.create_event", {"title": "Door", "start": at(6, 12, 30).isoformat()},
                       outside=["file notes.txt"]).data["event"]
        source = f"calendar event {written['id']} (written from file notes.txt)"
        listed = call("calendar.list_events", {"start": at(6, 0).isoformat(), "end": at(7, 0).isoformat()})
        assert listed.outside == (source,)
        overlapping = call("calendar.create_event", {"title": "Call", "start": at(6, 12, 45).isoformat()})
        assert overlapping.outside == (source,)  # it overlaps the owner's lunch and the written event

    def test_the_owners_own_events_are_not(self, call, events):
        listed = call("calendar.list_events", {"start": at(6, 0).isoformat(), "end": at(14, 0).isoformat()})
        assert listed.ok and listed.data["events"] and listed.outside == ()
