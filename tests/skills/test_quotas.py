"""Per-user caps (skills/quotas.py): rows per domain and the workspace's files and bytes.

Past a cap a write is refused with a SkillError naming the cap, nothing is written (no
row, no mail, no file), the user can still read and replace, and another user is not
affected. The race for the last slot between two workers is in the PostgreSQL tests
at the end (SQLite has one writer at a time).
"""

from __future__ import annotations

import threading

import pytest
from django.core import mail
from django.db import connections

from skills.executor import execute_skill
from skills.models import CalendarEvent, Memory, OutboxEmail, SkillCircuit, Task
from tests.factories import conversation_for, dispatch_for, turn_for

CREATE = {  # domain → (skill, arguments of the n-th call, its rows)
    "tasks": ("tasks.create", lambda n: {"title": f"Task {n}"}, Task),
    "calendar": ("calendar.create_event", lambda n: {"title": f"Event {n}", "start": f"2026-12-0{n + 1}T10:00"},
                 CalendarEvent),
    "memory": ("memory.save", lambda n: {"text": f"Fact {n}"}, Memory),
    "email": ("email.send", lambda n: {"to": ["sam@example.com"], "subject": f"Mail {n}", "body": "Hi"},
              OutboxEmail),
}


@pytest.fixture
def caps(settings):
    settings.SKILLS_MAX_ROWS = {domain: 2 for domain in CREATE}
    settings.SKILLS_WORKSPACE_MAX_ENTRIES = 3
    settings.SKILLS_WORKSPACE_MAX_BYTES = 100


@pytest.mark.parametrize("domain", list(CREATE))
def test_rows_past_the_cap_are_refused_and_others_unaffected(caps, call, ok, alice, bob, domain):
    skill, arguments, model = CREATE[domain]
    ok(skill, arguments(0))
    ok(skill, arguments(1))

    refused = call(skill, arguments(2))
    assert (refused.ok, refused.error_kind, refused.retryable) == (False, "failed", False)
    assert refused.error.startswith("the cap of 2 ") and "per user is reached (2 now)" in refused.error
    assert model.objects.filter(owner=alice).count() == 2
    assert len(mail.outbox) == (2 if domain == "email" else 0)
    assert not SkillCircuit.objects.exists()  # a cap is the caller's limit, not an outage

    ok(skill, arguments(2), user=bob)  # bob has his own allowance
    assert model.objects.filter(owner=bob).count() == 1


def test_reading_and_changing_go_on_at_the_cap(caps, ok, call):
    first = ok("tasks.create", {"title": "One"})["task"]
    ok("tasks.create", {"title": "Two"})
    assert not call("tasks.create", {"title": "Three"}).ok
    assert ok("tasks.update", {"task_id": first["id"], "title": "Uno"})["task"]["title"] == "Uno"
    assert ok("tasks.search", {})["total"] == 2


def test_the_workspace_caps_files_and_folders(caps, ok, call, bob):
    ok("files.write", {"path": "a.txt", "content": "a"})
    ok("files.write", {"path": "b.txt", "content": "b"})
    nested = call("files.write", {"path": "notes/c.txt", "content": "c"})  # a folder and a file
    assert nested.error == (
        "writing 'notes/c.txt' would make 4 files and folders in the workspace; the cap is 3 per "
        "user (existing files can still be replaced)"
    )
    ok("files.write", {"path": "c.txt", "content": "c"})
    assert call("files.append", {"path": "d.txt", "content": "d"}).error.startswith(
        "writing 'd.txt' would make 4 files and folders"
    )
    assert ok("files.write", {"path": "a.txt", "content": "again"})["created"] is False
    assert [entry["name"] for entry in ok("files.list", {})["entries"]] == ["a.txt", "b.txt", "c.txt"]
    ok("files.write", {"path": "notes/d.txt", "content": "d"}, user=bob)


def test_the_workspace_caps_bytes(caps, ok, call, workspace, alice):
    ok("files.write", {"path": "big.txt", "content": "x" * 60})
    refused = call("files.write", {"path": "more.txt", "content": "y" * 50})
    assert refused.error == "writing 'more.txt' would bring the workspace to 110 bytes; the cap is 100 bytes per user"
    assert call("files.append", {"path": "big.txt", "content": "z" * 41}).error.startswith(
        "writing 'big.txt' would bring the workspace to 101 bytes"
    )
    ok("files.write", {"path": "big.txt", "content": "x" * 90})  # replaced: 90 in all
    ok("files.write", {"path": "big.txt", "content": "x" * 10})  # smaller: always
    ok("files.write", {"path": "more.txt", "content": "y" * 50})
    assert sorted(p.name for p in (workspace / str(alice.pk)).iterdir()) == ["big.txt", "more.txt"]


def race_for_the_last_slot(user, skill: str, arguments: list[dict]) -> list:
    """Each call in its own thread (its own connection), all released at once."""
    dispatches = [dispatch_for(turn_for(conversation_for(user)), agent_id=f"a{n}") for n in range(len(arguments))]
    start = threading.Barrier(len(arguments))
    outcomes = []

    def worker(n):
        try:
            start.wait()
            outcomes.append(execute_skill(name=skill, arguments=arguments[n], user=user,
                                          tool_call_id="call_1", scope={"dispatch": dispatches[n]}))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(len(arguments))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_workers_cannot_both_take_the_last_row(settings, alice):
    settings.SKILLS_MAX_ROWS = {**settings.SKILLS_MAX_ROWS, "tasks": 3}
    Task.objects.create(owner=alice, title="Already there")
    Task.objects.create(owner=alice, title="And this")
    outcomes = race_for_the_last_slot(alice, "tasks.create", [{"title": f"Racer {n}"} for n in range(4)])
    assert sorted(outcome.ok for outcome in outcomes) == [False, False, False, True]
    assert Task.objects.filter(owner=alice).count() == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_workers_cannot_both_take_the_last_workspace_entry(settings, alice):
    settings.SKILLS_WORKSPACE_MAX_ENTRIES = 1
    outcomes = race_for_the_last_slot(
        alice, "files.write", [{"path": f"racer{n}.txt", "content": "x"} for n in range(4)])
    assert sorted(outcome.ok for outcome in outcomes) == [False, False, False, True]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_capped_write_held_open_does_not_hold_up_the_owners_spend_bookkeeping(alice):
    """email.send keeps its transaction, and the owner's capped-write lock, open across
    the send (a slow mail server: seconds). Meanwhile the engine starts the owner's spend
    period, which locks the owner's user row. When the capped-write lock was that row,
    the engine's database thread waited out the send, and enough slow sends tied up
    every thread of the runner: other users' steps waited too (tests/live/test_seams.py)."""
    from django.db import transaction
    from django.utils import timezone

    from orchestration.budgets.spending import spend_periods_start
    from orchestration.models import SpendCounter
    from skills.egress import reserve_daily

    sending, sent = threading.Event(), threading.Event()

    def slow_send():
        try:
            with transaction.atomic():
                reserve_daily(alice, ["bob@example.com"])
                sending.set()
                sent.wait(timeout=30)
        finally:
            connections.close_all()

    def bookkeeping():
        try:
            spend_periods_start(user=alice, now=timezone.now())
        finally:
            connections.close_all()

    sender = threading.Thread(target=slow_send)
    sender.start()
    try:
        assert sending.wait(timeout=10)
        engine = threading.Thread(target=bookkeeping)
        engine.start()
        engine.join(timeout=5)
        held_up = engine.is_alive()
    finally:
        sent.set()
        sender.join(timeout=30)
    engine.join(timeout=30)
    assert not held_up, "the spend period waited for the send to commit"
    assert SpendCounter.objects.filter(user=alice).count() == 2  # the day's and the month's


@pytest.mark.django_db(transaction=True)
def test_the_owner_lock_outside_a_transaction_is_refused_not_silently_released(alice):
    """Outside a transaction the lock would end with its own statement and guard nothing:
    a caller that forgot the transaction hears so, on SQLite too, where it takes nothing."""
    from django.db.transaction import TransactionManagementError

    from skills.quotas import owner_lock

    with pytest.raises(TransactionManagementError, match="inside one"):
        owner_lock(alice)
