"""A superuser deletes a user and everything of theirs (issue 18), through the admin:
afterwards no row in any table references them or their conversations, turns, agents or
rules (every foreign key of every installed model is walked), their workspace directory
is gone, and bob's data is exactly as it was. Staff without superuser rights cannot.

Run on SQLite and on PostgreSQL (DATABASE_URL): the cascade differs between them (SQLite
checks foreign keys at commit, PostgreSQL's are deferred too, but its full-text memory
search and JSON columns are its own)."""

from __future__ import annotations

import threading

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from assistant.models import RequestStamp
from assistant.preferences import preferences_time_zone_set
from orchestration.models import AgentDispatch, Conversation, Event, SkillApproval, SpendAllowance, Turn, TurnPause
from skills.domains.files.workspace import workspace_root
from skills.models import EgressAllow, Memory, SkillRule, Task
from tests.checks import references
from tests.conftest import make_user
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"


@pytest.fixture(autouse=True)
def workspaces(settings, tmp_path):
    settings.SKILLS_WORKSPACE_ROOT = tmp_path / "workspaces"


def user_rows(user) -> dict:
    """The user and the rows of theirs other rows may point at, by model."""
    return {
        get_user_model(): {user.pk},
        Conversation: set(Conversation.objects.filter(owner=user).values_list("pk", flat=True)),
        Turn: set(Turn.objects.filter(conversation__owner=user).values_list("pk", flat=True)),
        AgentDispatch: set(AgentDispatch.objects.filter(turn__conversation__owner=user).values_list("pk", flat=True)),
        SkillRule: set(SkillRule.objects.filter(owner=user).values_list("pk", flat=True)),
    }


def everything_of(run_turn, user) -> dict:
    """A real turn (messages, agents, skill calls, LLM calls, events, an email, a meeting),
    a paused turn with an approval its owner answered, and a row in every domain."""
    run_turn(EXAMPLE, user=user)
    paused = turn_for(conversation_for(user, title="Waiting"), status="completed")
    dispatch = dispatch_for(paused, "mailer", state="closed", outcome="completed")
    rule = SkillRule.objects.create(owner=user, skill="email.send", policy="allow")
    TurnPause.objects.create(turn=paused, limit="approval", decision="continue", decided_by=user)
    SkillApproval.objects.create(turn=paused, dispatch=dispatch, skill="email.send", digest="d", decided_by=user,
                                 decision="approved", rule=rule)
    Event.objects.create(conversation=paused.conversation, turn=paused, dispatch=dispatch, type="approval.asked",
                         summary="asked")
    Task.objects.create(owner=user, title="Pay rent")
    Memory.objects.create(owner=user, text="My locker code is 1234")
    EgressAllow.objects.create(owner=user, entry="example.com")
    preferences_time_zone_set(user=user, time_zone="Europe/Paris")
    (workspace_root(user) / "notes.txt").write_text("private notes")
    SpendAllowance.objects.create(user=user, tokens_per_day=10_000)
    RequestStamp.objects.create(user=user, action="message", at=timezone.now())
    AccessAttempt.objects.create(username=user.get_username(), ip_address="192.0.2.1", user_agent="test",
                                 failures_since_start=2)
    return user_rows(user)


def test_a_superuser_deletes_a_user_and_everything_of_theirs(run_turn, alice, bob, superuser, client):
    alices, bobs = everything_of(run_turn, alice), everything_of(run_turn, bob)
    before = references(alices)
    # Not vacuous: every kind of row is there to be deleted.
    for name in ("orchestration.Conversation.owner", "orchestration.Event.conversation", "orchestration.Event.turn",
                 "orchestration.Event.dispatch", "orchestration.LLMCall.turn", "orchestration.SkillExecution.dispatch",
                 "orchestration.Message.turn", "orchestration.SkillApproval.decided_by", "orchestration.TurnPause.decided_by",
                 "skills.Task.owner", "skills.Memory.owner", "skills.CalendarEvent.owner", "skills.OutboxEmail.owner",
                 "skills.SkillRule.owner", "skills.EgressAllow.owner", "orchestration.SkillApproval.rule",
                 "assistant.Preferences.user", "orchestration.SpendAllowance.user",
                 "orchestration.SpendCounter.user", "assistant.RequestStamp.user"):
        assert before.get(name), (name, before)
    bobs_before = references(bobs)
    workspace = workspace_root(alice)

    client.force_login(superuser)
    url = reverse("admin:auth_user_delete", args=[alice.pk])
    confirm = client.get(url)
    assert confirm.status_code == 200 and "protected" not in confirm.content.decode().lower()
    response = client.post(url, {"post": "yes"})
    assert response.status_code == 302, response.content.decode()[:2000]

    assert not get_user_model().objects.filter(pk=alices[get_user_model()].pop()).exists()
    assert references(alices) == {}
    assert not workspace.exists()
    assert references(bobs) == bobs_before
    assert (workspace_root(bob) / "notes.txt").read_text() == "private notes"
    # the login throttle's records name users as text: alice's go, bob's stay
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["bob"]


def test_the_admins_bulk_delete_goes_the_same_way(run_turn, superuser, client):
    carol = make_user("carol")
    targets = everything_of(run_turn, carol)
    workspace = workspace_root(carol)
    client.force_login(superuser)
    response = client.post(reverse("admin:auth_user_changelist"),
                           {"action": "delete_selected", "_selected_action": [carol.pk], "post": "yes"})
    assert response.status_code == 302
    assert references(targets) == {} and not workspace.exists()


def test_staff_cannot_delete_users_even_with_the_permission(run_turn, alice, client):
    everything_of(run_turn, alice)
    staff = make_user("staffer", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_user", "delete_user", "change_user"]))
    client.force_login(staff)
    url = reverse("admin:auth_user_delete", args=[alice.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert get_user_model().objects.filter(pk=alice.pk).exists() and workspace_root(alice).joinpath("notes.txt").exists()


def test_a_user_with_events_still_cannot_be_deleted_outside_the_service(run_turn, alice):
    from django.db.models import ProtectedError

    everything_of(run_turn, alice)
    with pytest.raises(ProtectedError):
        alice.delete()
    assert Event.objects.filter(conversation__owner=alice).exists()


@pytest.mark.postgres
def test_a_worker_committing_mid_deletion_cannot_break_it(alice, monkeypatch):
    """A worker still running alice's turn commits a message while a superuser deletes
    her, after Django collected what to delete and before the DELETE: the deletion must
    still succeed and leave nothing, and the worker's late row is refused instead (its
    foreign keys are checked at its commit, against the locked turn)."""
    from django.db.models.deletion import Collector

    from orchestration.models import Message

    turn = turn_for(conversation_for(alice))
    collected, outcome = threading.Event(), {}
    worker_done = threading.Event()
    collector_delete = Collector.delete

    def delete_after_the_worker_tried(self):
        collected.set()
        worker_done.wait(3)  # with the locks the worker's commit waits for this deletion
        return collector_delete(self)

    monkeypatch.setattr(Collector, "delete", delete_after_the_worker_tried)

    def worker():
        try:
            with transaction.atomic():
                Message.objects.create(conversation=turn.conversation, turn=turn, seq=1, role="assistant",
                                       content="late")
                assert collected.wait(10)
            outcome["worker"] = "committed"
        except Exception as exc:  # noqa: BLE001 - the expected refusal, checked below
            outcome["worker"] = type(exc).__name__
        finally:
            worker_done.set()
            connection.close()

    threads = [threading.Thread(target=worker), threading.Thread(target=deleting, args=(alice, outcome))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert "error" not in outcome, outcome["error"]
    assert outcome["worker"] == "IntegrityError"
    assert not Message.objects.exists() and not Turn.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time: no deadlock")
def test_a_deletion_that_deadlocks_with_a_running_step_runs_again(alice):
    """A worker holds alice's turn (the schedule's lock) and commits an event, whose
    foreign keys wait for the conversation the deletion has locked, while the deletion
    waits for the turn: PostgreSQL rolls the deletion back as a deadlock (it waited
    first, so its check runs first), and it runs again once the worker has committed,
    leaving nothing of hers."""
    from orchestration.lifecycle.dispatches import lock_turn

    turn = turn_for(conversation_for(alice))
    holding, deletion_waits, outcome = threading.Event(), threading.Event(), {}

    def worker():
        try:
            with transaction.atomic():
                lock_turn(turn.pk)
                holding.set()
                assert deletion_waits.wait(10)
                Event.objects.create(conversation=turn.conversation, turn=turn, type="agent.progress", summary="late")
            outcome["worker"] = "committed"
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["worker"] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    def someone_waits_on_a_lock() -> bool:
        # From this thread's own connection, out of any transaction: a transaction sees
        # the activity view as it was when it first read it.
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0] > 0

    worker_thread = threading.Thread(target=worker)
    superuser_thread = threading.Thread(target=deleting, args=(alice, outcome))
    worker_thread.start()
    assert holding.wait(10)
    superuser_thread.start()
    for _ in range(500):
        if someone_waits_on_a_lock():
            deletion_waits.set()
            break
        threading.Event().wait(0.01)
    for thread in (worker_thread, superuser_thread):
        thread.join(30)
    assert "error" not in outcome, outcome["error"]
    assert outcome["worker"] == "committed"
    assert not Event.objects.exists() and not Turn.objects.exists() and not Conversation.objects.exists()


def deleting(user, outcome: dict) -> None:
    """A superuser's deletion of `user`, in a thread of its own: what it removed, or the
    error, goes in `outcome` for the test's thread to check."""
    from orchestration.reports.retention import user_delete

    try:
        outcome["deleted"] = user_delete(user=user)
    except Exception as exc:  # noqa: BLE001 - reported in the test's thread
        outcome["error"] = exc
    finally:
        connection.close()
