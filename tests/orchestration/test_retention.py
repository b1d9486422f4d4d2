"""Retention (issue 18): `manage.py prune` ages out finished turns' transcripts and
leaves a tombstone whose figures keep every usage total right; active turns and turns
inside the window are never touched; events still cannot be edited, and leave only
through orchestration/reports/retention.py.

Real turns: the offline planner drives the real engine inline (three agents, real skill
calls, an email in the outbox), priced here so that costs are at stake too."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models import ProtectedError
from django.urls import reverse
from django.utils import timezone

from orchestration.budgets.usage import conversation_spend, turn_spend
from orchestration.llm.offline import OFFLINE_MODEL
from orchestration.models import (
    AgentDispatch,
    AppendOnlyError,
    Event,
    LLMCall,
    Message,
    SkillExecution,
    Turn,
    TurnPause,
    retention_deleting,
)
from orchestration.reports.audit import conversation_audit
from orchestration.reports.retention import DeletionRefused, age_parse, conversation_delete
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"


@pytest.fixture(autouse=True)
def priced_offline(settings):
    settings.ASSISTANT_MODEL_PRICES = {OFFLINE_MODEL: {"input": 0.15, "output": 0.60}}


def age(turn: Turn, days: float) -> Turn:
    """As if the turn had finished `days` ago."""
    when = timezone.now() - timedelta(days=days)
    Turn.objects.filter(pk=turn.pk).update(started_at=when - timedelta(minutes=1), finished_at=when)
    turn.refresh_from_db()
    return turn


def prune(*args: str) -> str:
    out = StringIO()
    call_command("prune", *args, stdout=out)
    return out.getvalue()


def contents(turn: Turn) -> dict:
    """Everything of the turn that pruning removes or keeps, as plain values."""
    return {
        "messages": list(Message.objects.filter(turn=turn).values_list("content", flat=True)),
        "events": list(Event.objects.filter(turn=turn).values_list("pk", flat=True)),
        "executions": list(SkillExecution.objects.filter(dispatch__turn=turn).values_list("arguments", "result")),
        "responses": list(LLMCall.objects.filter(turn=turn).values_list("response", flat=True)),
        "missions": list(AgentDispatch.objects.filter(turn=turn).values_list("mission", "result", "transcript")),
        "pauses": list(TurnPause.objects.filter(turn=turn).values_list("pk", flat=True)),
    }


@pytest.fixture
def old_turn(run_turn):
    return age(run_turn(EXAMPLE), days=120)


def test_prune_removes_an_old_turns_transcript_and_leaves_a_tombstone(run_turn, old_turn, bob):
    recent = age(run_turn(EXAMPLE), days=10)
    paused = age(turn_for(conversation_for(bob), status="paused"), days=400)
    Turn.objects.filter(pk=paused.pk).update(finished_at=None)
    Event.objects.create(conversation=paused.conversation, turn=paused, type="turn.paused", summary="paused")
    TurnPause.objects.create(turn=paused, limit="turn_max_agents")
    before = {turn.pk: contents(turn) for turn in (old_turn, recent, paused)}
    assert all(before[old_turn.pk][k] for k in ("messages", "events", "executions", "responses", "missions"))
    spend_before, conversation_before = turn_spend(old_turn), conversation_spend(old_turn.conversation)
    assert spend_before.total.cost is not None and spend_before.total.total_tokens > 0

    output = prune()

    assert "batch 1: pruned 1 turn in 1 conversation: " in output
    after = contents(old_turn)
    assert after["messages"] == [] and after["events"] == [] and after["executions"] == [] and after["pauses"] == []
    assert set(map(json.dumps, after["responses"])) == {"{}"}
    assert all(mission == "" and result == "" and transcript == [] for mission, result, transcript in after["missions"])
    # Usage is summed from the LLM calls, which keep their tokens and cost: nothing moves.
    old_turn.refresh_from_db()
    assert turn_spend(old_turn) == spend_before
    assert conversation_spend(old_turn.conversation) == conversation_before
    stone = old_turn.tombstone
    assert old_turn.pruned_at is not None
    assert stone["messages"] == len(before[old_turn.pk]["messages"])
    assert stone["events"] == len(before[old_turn.pk]["events"])
    assert stone["skill_calls"] == len(before[old_turn.pk]["executions"]) == 3
    assert stone["agents"] == 3 and stone["llm_calls"] == len(before[old_turn.pk]["responses"])
    assert stone["tokens"] == spend_before.total.total_tokens
    assert stone["cost_usd"] == f"{spend_before.total.cost:f}"
    assert stone["finished_at"] == old_turn.finished_at.isoformat()
    # The audit trail says what was there.
    (exported,) = conversation_audit(old_turn.conversation)["turns"]
    assert exported["tombstone"] == stone and exported["events"] == [] and exported["dispatches"][0]["mission"] == ""
    # Inside the window, and active whatever its age: untouched.
    assert contents(recent) == before[recent.pk] and contents(paused) == before[paused.pk]
    assert Turn.objects.filter(pruned_at__isnull=False).count() == 1


def test_the_pages_of_a_pruned_conversation_still_work(old_turn, alice, client):
    prune()
    client.force_login(alice)
    audit = client.get(reverse("conversation_audit", args=[old_turn.conversation_id]))
    assert audit.status_code == 200
    assert "Pruned past the retention window" in audit.content.decode()
    page = client.get(old_turn.conversation.get_absolute_url())
    assert page.status_code == 200 and "No messages yet" in page.content.decode()


def test_a_second_run_does_nothing(old_turn):
    prune()
    old_turn.refresh_from_db()
    stone, pruned_at = old_turn.tombstone, old_turn.pruned_at
    assert "Nothing to prune." in prune()
    old_turn.refresh_from_db()
    assert (old_turn.tombstone, old_turn.pruned_at) == (stone, pruned_at)


def test_dry_run_says_what_would_go_and_changes_nothing(old_turn, tmp_path):
    before = contents(old_turn)
    output = prune("--dry-run", "--export", str(tmp_path / "exports"))
    assert "Dry run" in output and "batch 1: would prune 1 turn in 1 conversation" in output
    assert f"would export {tmp_path / 'exports'}/conversation-{old_turn.conversation_id}-audit-" in output
    assert contents(old_turn) == before and not (tmp_path / "exports").exists()
    old_turn.refresh_from_db()
    assert old_turn.pruned_at is None


def test_export_writes_each_conversations_audit_before_pruning(old_turn, tmp_path):
    expected = json.loads(json.dumps(conversation_audit(old_turn.conversation), default=str))
    output = prune("--export", str(tmp_path))
    (path,) = tmp_path.glob(f"conversation-{old_turn.conversation_id}-audit-*.json")
    assert f"exported {path}" in output
    assert json.loads(path.read_text()) == expected
    assert [m["content"] for m in expected["messages"]][0] == EXAMPLE  # the transcript, kept in the file


def test_batches_report_progress_and_the_window_is_a_setting(run_turn, settings):
    turns = [age(run_turn(EXAMPLE), days=days) for days in (3, 4, 5)]
    settings.ASSISTANT_RETENTION_DAYS = 4
    output = prune("--batch-size", "1")
    assert "batch 2:" in output and "batch 3:" not in output
    assert [t.pk for t in Turn.objects.filter(pruned_at__isnull=False)] == [t.pk for t in turns[1:]]
    assert "batch 1:" in prune("--older-than", "48h") and Turn.objects.filter(pruned_at__isnull=True).count() == 0


def test_ages_are_days_or_hours():
    assert age_parse("90d") == timedelta(days=90) and age_parse("36h") == timedelta(hours=36)
    for nonsense in ("90", "0d", "-1d", "1w", "d", "90 days", ""):
        with pytest.raises(ValueError):
            age_parse(nonsense)
    with pytest.raises(CommandError, match="90d or 36h"):
        prune("--older-than", "ninety")


class TestEventsStayAppendOnly:
    @pytest.fixture
    def event(self, alice):
        turn = turn_for(conversation_for(alice), status="completed")
        dispatch_for(turn)
        return Event.objects.create(conversation=turn.conversation, turn=turn, type="turn.started", summary="s")

    def test_deleting_outside_retention_is_refused(self, event):
        with pytest.raises(AppendOnlyError):
            Event.objects.filter(pk=event.pk).delete()
        with pytest.raises(AppendOnlyError):
            event.delete()
        for row in (event.conversation, event.turn):
            with pytest.raises(ProtectedError):
                row.delete()
        with pytest.raises(ProtectedError):
            event.conversation.owner.delete()
        assert Event.objects.filter(pk=event.pk).exists()

    def test_no_update_even_inside_retention(self, event):
        with retention_deleting():
            with pytest.raises(AppendOnlyError):
                Event.objects.filter(pk=event.pk).update(summary="rewritten")
            event.summary = "rewritten"
            with pytest.raises(AppendOnlyError):
                event.save()
        event.refresh_from_db()
        assert event.summary == "s"

    def test_the_guard_ends_with_its_block(self, event):
        with retention_deleting():
            pass
        with pytest.raises(AppendOnlyError):
            Event.objects.filter(pk=event.pk).delete()


class TestConversationDelete:
    def test_the_owner_deletes_everything_in_it(self, run_turn, alice, bob):
        turn = run_turn(EXAMPLE)
        bobs = run_turn(EXAMPLE, user=bob)
        bobs_before = contents(bobs)
        removed = conversation_delete(conversation=turn.conversation, user=alice)
        assert removed["orchestration.Event"] > 0 and removed["orchestration.Message"] > 0
        assert not Turn.objects.filter(pk=turn.pk).exists()
        assert not Event.objects.filter(conversation_id=turn.conversation_id).exists()
        assert not LLMCall.objects.filter(turn_id=turn.pk).exists()
        assert contents(bobs) == bobs_before

    def test_refused_to_anyone_else(self, alice, bob):
        conversation = conversation_for(alice)
        with pytest.raises(DeletionRefused, match="owner"):
            conversation_delete(conversation=conversation, user=bob)
        assert conversation.__class__.objects.filter(pk=conversation.pk).exists()

    @pytest.mark.parametrize("status", ["running", "waiting", "paused"])
    def test_refused_while_a_turn_is_active(self, alice, status):
        turn = turn_for(conversation_for(alice), status=status)
        Event.objects.create(conversation=turn.conversation, turn=turn, type="turn.started", summary="s")
        with pytest.raises(DeletionRefused, match="stop it first"):
            conversation_delete(conversation=turn.conversation, user=alice)
        assert Event.objects.filter(turn=turn).exists()


def test_prune_throughput_is_measured(alice):
    """Many small turns, pruned in batches of 50: the time is printed (with the no-op
    second run beside it), not asserted; each batch is one bounded transaction."""
    import time

    turns = []
    for c in range(10):
        conversation = conversation_for(alice, title=f"c{c}")
        for _ in range(20):
            turn = turn_for(conversation, status="completed")
            dispatch = dispatch_for(turn, mission="m" * 200, transcript=[{"role": "user", "content": "x" * 500}])
            seq = Message.objects.filter(conversation=conversation).count()
            Message.objects.bulk_create([Message(conversation=conversation, turn=turn, seq=seq + i, role="user",
                                                 content="y" * 300) for i in range(1, 5)])
            SkillExecution.objects.bulk_create([SkillExecution(dispatch=dispatch, skill="tasks.search",
                                                               tool_call_id=f"c{i}", arguments={"q": "z" * 100})
                                                for i in range(4)])
            Event.objects.bulk_create([Event(conversation=conversation, turn=turn, type="skill.finished", summary="s")
                                       for _ in range(10)])
            LLMCall.objects.bulk_create([LLMCall(turn=turn, dispatch=dispatch, key=f"k{i}", prompt_tokens=100,
                                                 response={"content": "w" * 400}) for i in range(3)])
            turns.append(turn)
    Turn.objects.filter(pk__in=[t.pk for t in turns]).update(finished_at=timezone.now() - timedelta(days=100))
    started = time.perf_counter()
    output = prune("--batch-size", "50")
    first = time.perf_counter() - started
    started = time.perf_counter()
    assert "Nothing to prune." in prune()
    second = time.perf_counter() - started
    assert "batch 4:" in output and "batch 5:" not in output
    assert not Event.objects.exists() and not Message.objects.exists() and not SkillExecution.objects.exists()
    print(f"\nprune: {len(turns)} turns (4 messages, 10 events, 4 skill calls, 3 LLM calls each) in {first:.2f} s "
          f"({len(turns) / first:.0f} turns/s, 4 batches); the second run, with nothing to do: {second:.3f} s")
