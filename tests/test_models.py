import pytest
from django.db import IntegrityError, transaction

from orchestration.models import AppendOnlyError, Event, SkillExecution, Turn, TurnStatus
from tests.factories import conversation_for, dispatch_for, turn_for


@pytest.fixture
def turn(alice):
    return turn_for(conversation_for(alice))


def test_agent_id_is_unique_per_turn(turn):
    dispatch_for(turn, "search")
    with pytest.raises(IntegrityError), transaction.atomic():
        dispatch_for(turn, "search")


def test_same_agent_id_in_another_turn_is_fine(turn):
    dispatch_for(turn, "search")
    turn.status = TurnStatus.COMPLETED
    turn.save()
    other = turn_for(turn.conversation)
    assert dispatch_for(other, "search").pk


def test_skill_execution_idempotency_key(turn):
    dispatch = dispatch_for(turn)
    SkillExecution.objects.create(dispatch=dispatch, skill="tasks.search", tool_call_id="call_1")
    with pytest.raises(IntegrityError), transaction.atomic():
        SkillExecution.objects.create(dispatch=dispatch, skill="tasks.search", tool_call_id="call_1")


def test_only_one_active_turn_per_conversation(turn):
    with pytest.raises(IntegrityError), transaction.atomic():
        Turn.objects.create(conversation=turn.conversation, number=2)
    turn.status = TurnStatus.COMPLETED
    turn.save()
    assert Turn.objects.create(conversation=turn.conversation, number=2).is_active


class TestEventsAreAppendOnly:
    @pytest.fixture
    def event(self, turn):
        return Event.objects.create(
            conversation=turn.conversation, turn=turn, type="turn.started", summary="Turn 1 started"
        )

    def test_save_again_is_refused(self, event):
        event.summary = "rewritten"
        with pytest.raises(AppendOnlyError):
            event.save()
        event.refresh_from_db()
        assert event.summary == "Turn 1 started"

    def test_delete_is_refused(self, event):
        with pytest.raises(AppendOnlyError):
            event.delete()
        with pytest.raises(AppendOnlyError):
            Event.objects.filter(pk=event.pk).delete()
        assert Event.objects.filter(pk=event.pk).exists()

    def test_queryset_update_is_refused(self, event):
        with pytest.raises(AppendOnlyError):
            Event.objects.filter(pk=event.pk).update(summary="rewritten")

    def test_conversation_with_events_cannot_be_deleted(self, event):
        from django.db.models import ProtectedError

        with pytest.raises(ProtectedError):
            event.conversation.delete()


def test_profile_edit_bumps_version(db):
    from orchestration.models import AgentProfile

    profile = AgentProfile.objects.create(name="analyst", system_prompt="Find facts.")
    assert profile.version == 1
    profile.system_prompt = "Find facts, cite sources."
    profile.save()
    profile.refresh_from_db()
    assert profile.version == 2


def test_events_are_written_as_the_orm_would_write_them(turn):
    """`events_record` writes its own INSERT (orchestration/records/inserts.py): the rows,
    their ids and times, read back as saved, in as many statements as the database's
    parameter limit needs (SQLite's: a batch of 300 events is more than one)."""
    from orchestration.records.events import events_record

    dispatch = dispatch_for(turn)
    events = [Event(conversation_id=turn.conversation_id, turn=turn, dispatch=dispatch if n % 2 else None,
                    type="agent.llm_call", summary=f"step {n}", payload={"n": n, "text": "é \u2028 \"quoted\""})
              for n in range(300)]
    with transaction.atomic():
        events_record(events)
    stored = {event.pk: event for event in Event.objects.filter(turn=turn)}
    assert len(stored) == 300 and [e.pk for e in events] == sorted(e.pk for e in events)
    for event in events:
        again = stored[event.pk]
        assert not event._state.adding
        assert (again.summary, again.payload, again.dispatch_id, again.created_at) == (
            event.summary, event.payload, event.dispatch_id, event.created_at)
