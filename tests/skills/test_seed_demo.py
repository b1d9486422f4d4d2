"""seed_demo gives a user something to find, and running it twice adds nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from skills.models import CalendarEvent, Memory, Task


def seed(username: str) -> str:
    out = StringIO()
    call_command("seed_demo", "--user", username, stdout=out)
    return out.getvalue()


def test_seeds_tasks_events_and_memories(alice, ok):
    assert seed("alice") == (
        "tasks: 5 created, 0 already there\n"
        "calendar events: 3 created, 0 already there\n"
        "memories: 4 created, 0 already there\n"
    )
    assert ok("tasks.search", {"overdue": True})["total"] == 2
    assert len(ok("calendar.list_events", {})["events"]) == 3
    assert ok("memory.search", {"query": "dentist"})["memories"][0]["text"].startswith("My dentist")


def test_running_it_twice_adds_nothing(alice):
    seed("alice")
    assert seed("alice") == (
        "tasks: 0 created, 5 already there\n"
        "calendar events: 0 created, 3 already there\n"
        "memories: 0 created, 4 already there\n"
    )
    assert (Task.objects.count(), CalendarEvent.objects.count(), Memory.objects.count()) == (
        5,
        3,
        4,
    )


def test_only_that_users_records(alice, bob):
    seed("alice")
    assert not Task.objects.filter(owner=bob).exists()


def test_an_unknown_user_is_an_error(db):
    with pytest.raises(CommandError, match="No user 'nobody'"):
        seed("nobody")
