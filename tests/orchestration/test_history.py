"""What the orchestrator's prompt holds of the conversation (orchestration/records/history.py):
earlier turns' questions and answers, and this turn's everything; and what it reads for
that, which must not grow with earlier turns' tool traffic."""

from __future__ import annotations

import pytest
from django.db.models.signals import post_init

from orchestration.models import Message
from orchestration.records.history import ENGINE_NOTE_PREFIX, llm_messages, message_append, messages_append
from tests.factories import conversation_for, turn_for

pytestmark = pytest.mark.django_db

CALL = [{"id": "call_1", "type": "function", "function": {"name": "get_agent_results", "arguments": "{}"}}]


def _a_finished_turn(conversation, number: int):
    turn = turn_for(conversation, status="completed")
    for role, fields in [
        (Message.Role.USER, {"content": f"question {number}"}),
        (Message.Role.ASSISTANT, {"tool_calls": CALL}),
        (Message.Role.TOOL, {"content": "a long result " * 200, "tool_call_id": "call_1"}),
        (Message.Role.NOTE, {"content": "a correction"}),
        (Message.Role.NOTICE, {"content": "shown to the user only"}),
        (Message.Role.ASSISTANT, {"content": f"answer {number}"}),
    ]:
        message_append(turn=turn, role=role, **fields)
    return turn


@pytest.fixture
def loaded(monkeypatch):
    """How many Message rows are built from the database meanwhile."""
    built = []

    def count(sender, instance, **kwargs):
        built.append(instance)

    post_init.connect(count, sender=Message)
    yield built
    post_init.disconnect(count, sender=Message)


def test_earlier_turns_give_their_questions_and_answers_and_this_turn_everything_but_notices(alice, loaded):
    conversation = conversation_for(alice)
    for number in (1, 2, 3):
        _a_finished_turn(conversation, number)
    turn = turn_for(conversation)
    message_append(turn=turn, role=Message.Role.USER, content="question 4")
    message_append(turn=turn, role=Message.Role.ASSISTANT, tool_calls=CALL)
    message_append(turn=turn, role=Message.Role.TOOL, content="result", tool_call_id="call_1")
    message_append(turn=turn, role=Message.Role.NOTE, content="mind the limit")
    message_append(turn=turn, role=Message.Role.NOTICE, content="not for the model")
    loaded.clear()

    messages = llm_messages(turn=turn, system_prompt="system")

    assert messages == [
        {"role": "system", "content": "system"},
        {"role": "user", "content": "question 1"}, {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "question 2"}, {"role": "assistant", "content": "answer 2"},
        {"role": "user", "content": "question 3"}, {"role": "assistant", "content": "answer 3"},
        {"role": "user", "content": "question 4"},
        {"role": "assistant", "content": None, "tool_calls": CALL},
        {"role": "tool", "tool_call_id": "call_1", "content": "result"},
        {"role": "user", "content": ENGINE_NOTE_PREFIX + "mind the limit"},
    ]
    # Read: this turn's four, and each earlier turn's question and its assistant messages
    # (the one with tool calls is dropped in Python); not their tool results or notes.
    assert len(loaded) == 4 + 3 * 3


def test_a_batch_is_numbered_after_the_conversation_in_its_order(alice):
    """`messages_append` numbers its rows in its own INSERT (orchestration/records/inserts.py):
    after the conversation's last, in order, with no gap, however many statements the
    database's limit on parameters splits a batch into."""
    turn = turn_for(conversation_for(alice))
    message_append(turn=turn, role=Message.Role.USER, content="question")
    results = [{"role": "tool", "content": f"result {n}", "tool_call_id": f"call_{n}"} for n in range(300)]
    appended = messages_append(turn=turn, messages=results)
    assert [m.seq for m in appended] == list(range(2, 302))  # read back: the statement numbered them
    stored = list(Message.objects.filter(conversation=turn.conversation).order_by("seq"))
    assert [(m.seq, m.content) for m in stored] == [(1, "question")] + [(n + 2, f"result {n}") for n in range(300)]
    assert [m.pk for m in appended] == [m.pk for m in stored[1:]]
