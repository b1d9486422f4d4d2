"""A conversation's title, made from its first request (orchestration/lifecycle/turns.py)."""

from __future__ import annotations

import pytest

from orchestration.models import Conversation
from orchestration.lifecycle.turns import conversation_title, turn_start
from tests.factories import conversation_for

pytestmark = pytest.mark.django_db

SEED = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"


@pytest.mark.parametrize(("text", "title"), [
    ("add a task: renew passport", "add a task: renew passport"),
    (SEED, SEED),  # whole: five requests that begin alike are told apart (the list ends a line in …)
    (SEED + " and then " + SEED, SEED + " and then find my overdue…"),  # cut at a word
    ("\n\n  what do you\tremember   about wifi  \nand more lines", "what do you remember about wifi"),
    ("x" * 150, "x" * 120 + "…"),  # no word to cut at
])
def test_the_title_is_the_first_line_short_and_clean(text, title):
    assert conversation_title(text) == title
    assert len(conversation_title(text)) <= 121


def test_the_first_request_names_the_conversation_and_the_next_does_not(alice):
    conversation = conversation_for(alice, title="")
    turn = turn_start(conversation=conversation, text=SEED)
    conversation.refresh_from_db()
    assert conversation.title == SEED
    turn.status = "completed"
    turn.save()
    turn_start(conversation=conversation, text="add a task: renew passport")
    conversation.refresh_from_db()
    assert conversation.title == SEED


# --- the engine's own account of what did not go as asked (issue 16) -------------------------

@pytest.mark.django_db(transaction=True)
def test_an_answer_that_claims_success_is_followed_by_the_engines_record_of_failures(llm, run_turn):
    from tests.support.llm_server import Agent, Plan

    llm.respond = Plan([
        Agent("finder", ["tasks.search"], [("tasks.search", {"status": "open"})]),
        Agent("writer", ["tasks.search"], [("tasks.create", {"title": "not granted"})], report="Done."),
    ], answer="All four agents ran and everything worked.", discover=False)
    turn = run_turn()
    assert turn.status == "completed", turn.error
    chat = list(turn.messages.filter(role__in=["assistant", "notice"], tool_calls=[]).order_by("seq")
                .values_list("role", "content"))
    assert chat[-2] == ("assistant", "All four agents ran and everything worked.")
    role, note = chat[-1]
    assert role == "notice" and note.startswith("From the engine's record:")
    assert "1 skill call failed (tasks.create)" in note


@pytest.mark.django_db(transaction=True)
def test_a_turn_where_everything_went_as_asked_gets_no_note(llm, run_turn):
    from tests.support.llm_server import Agent, Plan

    llm.respond = Plan([Agent("finder", ["tasks.search"], [("tasks.search", {"status": "open"})])],
                       answer="Found them.", discover=False)
    turn = run_turn()
    assert not turn.messages.filter(role="notice").exists()


@pytest.mark.django_db(transaction=True)
def test_offline_dispatches_name_the_planner_as_their_model(run_turn, settings):
    settings.ASSISTANT_LLM_PROVIDER = "offline"
    turn = run_turn("add a task: renew passport")
    assert set(turn.dispatches.values_list("model", flat=True)) == {"offline-planner"}
    assert set(turn.llm_calls.values_list("model", flat=True)) == {"offline-planner"}


@pytest.mark.django_db
def test_a_message_to_a_conversation_deleted_meanwhile_is_refused_not_a_crash(alice):
    """The page loaded the conversation, then its owner deleted it in another tab."""
    from orchestration.reports.retention import conversation_delete
    from orchestration.lifecycle.turns import TurnRefused

    conversation = conversation_for(alice)
    conversation_delete(conversation=Conversation.objects.get(pk=conversation.pk), user=alice)
    with pytest.raises(TurnRefused, match="has been deleted"):
        turn_start(conversation=conversation, text="Hello?")
