"""A conversation's title, made from its first request (orchestration/turns.py)."""

from __future__ import annotations

import pytest

from orchestration.turns import conversation_title, turn_start
from tests.factories import conversation_for

pytestmark = pytest.mark.django_db

SEED = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"


@pytest.mark.parametrize(("text", "title"), [
    ("add a task: renew passport", "add a task: renew passport"),
    (SEED, "find my overdue tasks, email them to…"),  # cut at a word, one line on a phone
    ("\n\n  what do you\tremember   about wifi  \nand more lines", "what do you remember about wifi"),
    ("x" * 80, "x" * 48 + "…"),  # no word to cut at
])
def test_the_title_is_the_first_line_short_and_clean(text, title):
    assert conversation_title(text) == title
    assert len(conversation_title(text)) <= 49


def test_the_first_request_names_the_conversation_and_the_next_does_not(alice):
    conversation = conversation_for(alice, title="")
    turn = turn_start(conversation=conversation, text=SEED)
    conversation.refresh_from_db()
    assert conversation.title == "find my overdue tasks, email them to…"
    turn.status = "completed"
    turn.save()
    turn_start(conversation=conversation, text="add a task: renew passport")
    conversation.refresh_from_db()
    assert conversation.title == "find my overdue tasks, email them to…"
