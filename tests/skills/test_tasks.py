"""tasks.*: search, create, update, complete — each user only ever sees their own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from skills.models import Task


def days(n: int) -> str:
    return (timezone.localdate() + timedelta(days=n)).isoformat()


@pytest.fixture
def tasks(alice, bob):
    """Alice's list (one overdue, one done, one without a date) and one of Bob's."""
    today = timezone.localdate()
    return {
        "late": Task.objects.create(
            owner=alice, title="Renew passport", due=today - timedelta(days=2)
        ),
        "soon": Task.objects.create(
            owner=alice,
            title="Call dentist",
            notes="about the crown",
            due=today + timedelta(days=3),
        ),
        "done": Task.objects.create(
            owner=alice, title="Pay rent", status="done", due=today - timedelta(days=5)
        ),
        "someday": Task.objects.create(owner=alice, title="Learn the cello"),
        "bobs": Task.objects.create(owner=bob, title="Bob's dentist", due=today),
    }


def titles(result: dict) -> list[str]:
    return [task["title"] for task in result["tasks"]]


class TestSearch:
    def test_everything_of_mine_due_first(self, ok, tasks):
        result = ok("tasks.search", {})
        assert titles(result) == ["Pay rent", "Renew passport", "Call dentist", "Learn the cello"]
        assert result["total"] == 4

    def test_text_matches_title_or_notes(self, ok, tasks):
        assert titles(ok("tasks.search", {"text": "DENTIST"})) == ["Call dentist"]
        assert titles(ok("tasks.search", {"text": "crown"})) == ["Call dentist"]

    def test_overdue(self, ok, tasks):
        result = ok("tasks.search", {"overdue": True})
        assert titles(result) == ["Renew passport"] and result["tasks"][0]["overdue"] is True
        assert titles(ok("tasks.search", {"overdue": False})) == [
            "Pay rent",
            "Call dentist",
            "Learn the cello",
        ]

    def test_status_and_due_range(self, ok, tasks):
        assert titles(ok("tasks.search", {"status": "done"})) == ["Pay rent"]
        window = {"due_after": days(-2), "due_before": days(3)}
        assert titles(ok("tasks.search", window)) == ["Renew passport", "Call dentist"]

    def test_limit_keeps_the_total(self, ok, tasks):
        result = ok("tasks.search", {"limit": 1})
        assert len(result["tasks"]) == 1 and result["total"] == 4

    def test_replay_answers_as_the_first_time(self, call, tasks, alice):
        first = call("tasks.search", {}, tool_call_id="s1")
        Task.objects.create(owner=alice, title="Added since")
        again = call("tasks.search", {}, tool_call_id="s1")
        assert again.replayed and again.data == first.data and again.data["total"] == 4

    def test_bob_sees_only_his_own(self, ok, tasks, bob):
        assert titles(ok("tasks.search", {"text": "dentist"}, user=bob)) == ["Bob's dentist"]


class TestCreate:
    def test_creates_an_open_task(self, ok, alice):
        result = ok("tasks.create", {"title": "Buy milk", "notes": "oat", "due": days(1)})
        task = Task.objects.get(owner=alice)
        assert result["task"] == {
            "id": task.pk,
            "title": "Buy milk",
            "notes": "oat",
            "status": "open",
            "due": days(1),
            "overdue": False,
            "created_at": result["task"]["created_at"],
            "completed_at": None,
        }

    def test_replay_creates_one_task(self, call, alice):
        first = call("tasks.create", {"title": "Buy milk"}, tool_call_id="call_7")
        again = call("tasks.create", {"title": "Buy milk"}, tool_call_id="call_7")
        assert again.replayed and again.data == first.data
        assert Task.objects.filter(owner=alice).count() == 1

    def test_a_date_that_does_not_exist_is_refused(self, call):
        outcome = call("tasks.create", {"title": "x", "due": "2025-02-30"})
        assert outcome.problems == ("'due' must be a string in YYYY-MM-DD format",)


class TestUpdate:
    def test_changes_only_what_is_given(self, ok, tasks):
        result = ok("tasks.update", {"task_id": tasks["soon"].pk, "title": "Call the dentist"})
        tasks["soon"].refresh_from_db()
        assert (tasks["soon"].title, tasks["soon"].notes) == ("Call the dentist", "about the crown")
        assert result["task"]["title"] == "Call the dentist"

    def test_null_clears_the_due_date(self, ok, tasks):
        ok("tasks.update", {"task_id": tasks["late"].pk, "due": None})
        tasks["late"].refresh_from_db()
        assert tasks["late"].due is None

    def test_nothing_to_change(self, call, tasks):
        outcome = call("tasks.update", {"task_id": tasks["soon"].pk})
        assert outcome.error == "nothing to update: give at least one of title, notes, due"

    def test_another_users_task_is_not_found(self, call, tasks):
        outcome = call("tasks.update", {"task_id": tasks["bobs"].pk, "title": "mine now"})
        assert (outcome.ok, outcome.error) == (False, f"task {tasks['bobs'].pk} not found")
        tasks["bobs"].refresh_from_db()
        assert tasks["bobs"].title == "Bob's dentist"

    def test_replay_does_not_apply_twice(self, call, tasks):
        arguments = {"task_id": tasks["soon"].pk, "title": "v2"}
        first = call("tasks.update", arguments, tool_call_id="call_1")
        Task.objects.filter(pk=tasks["soon"].pk).update(title="changed by hand since")
        assert call("tasks.update", arguments, tool_call_id="call_1").data == first.data
        tasks["soon"].refresh_from_db()
        assert tasks["soon"].title == "changed by hand since"


class TestComplete:
    def test_completes_once(self, ok, tasks):
        result = ok("tasks.complete", {"task_id": tasks["late"].pk})
        assert result["task"]["status"] == "done" and result["already_done"] is False
        assert result["task"]["completed_at"] and result["task"]["overdue"] is False
        again = ok("tasks.complete", {"task_id": tasks["late"].pk})
        assert again["already_done"] is True
        assert again["task"]["completed_at"] == result["task"]["completed_at"]

    def test_another_users_task_is_not_found(self, call, tasks):
        outcome = call("tasks.complete", {"task_id": tasks["bobs"].pk})
        assert outcome.error == f"task {tasks['bobs'].pk} not found"
        assert Task.objects.get(pk=tasks["bobs"].pk).status == "open"

    def test_a_missing_task_is_not_found(self, call, tasks):
        assert call("tasks.complete", {"task_id": 999_999}).error == "task 999999 not found"

    def test_replay(self, call, tasks):
        first = call("tasks.complete", {"task_id": tasks["late"].pk}, tool_call_id="c")
        again = call("tasks.complete", {"task_id": tasks["late"].pk}, tool_call_id="c")
        assert again.replayed and again.data == first.data and again.data["already_done"] is False


class TestProvenance:
    """A task an agent wrote from outside content is that content again when read back
    (skills/provenance.py); the owner's own tasks are not."""

    def test_a_task_keeps_what_had_reached_its_writer(self, ok):
        task = ok("tasks.create", {"title": "Call Bob"}, outside=["file notes.txt"])["task"]
        assert task["written_from"] == ["file notes.txt"]
        assert Task.objects.get(pk=task["id"]).provenance == ["file notes.txt"]

    def test_changes_add_to_it_and_never_clear_it(self, ok):
        task_id = ok("tasks.create", {"title": "Call Bob"}, outside=["file a.txt"])["task"]["id"]
        ok("tasks.update", {"task_id": task_id, "title": "Call Bob today"}, outside=["file b.txt", "file a.txt"])
        ok("tasks.update", {"task_id": task_id, "notes": "about the door"})  # a caller that read nothing
        ok("tasks.complete", {"task_id": task_id}, outside=["memory 3 (saved by an agent)"])
        assert Task.objects.get(pk=task_id).provenance == ["file a.txt", "file b.txt", "memory 3 (saved by an agent)"]

    def test_reading_it_back_is_outside_content(self, call, tasks):
        written = call("tasks.create", {"title": "Door code"}, outside=["file notes.txt"]).data["task"]
        found = call("tasks.search", {})
        assert found.outside == (f"task {written['id']} (written from file notes.txt)",)
        assert [t["title"] for t in found.data["tasks"] if "written_from" in t] == ["Door code"]
        changed = call("tasks.update", {"task_id": written["id"], "due": days(1)})
        assert changed.outside == found.outside  # its result shows the row too

    def test_the_owners_own_tasks_are_not(self, call, tasks):
        assert call("tasks.search", {}).outside == ()
        assert call("tasks.create", {"title": "Mine"}).outside == ()
