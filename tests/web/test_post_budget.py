"""A message's post has a statement budget, as the engine's steps have theirs
(tests/orchestration/test_statement_budget.py): it is the request every turn begins with.
A change that adds a statement fails here, so its diff says so, with the budget raised
beside it. Transaction control (BEGIN, SAVEPOINT, COMMIT) apart.

What it is, in order: the session, the user and their preferences (the time zone); the
conversation, theirs; the rate limit's window (its old stamps deleted, the rest counted;
on PostgreSQL under an advisory lock of the user's); the conversation locked, no turn
running in it, the next turn's number, the conversation's model calls in the limits'
window; the turn, its user message, the conversation's title, the event, the turn queued;
the rate limit's stamp; the queue's task (on PostgreSQL, and the notice that wakes the
workers)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from tests.factories import conversation_for
from tests.support.statements import CONTROL

pytestmark = pytest.mark.django_db(transaction=True)  # the post commits, and queues its turn then

# Raise one only with the feature that needs it, and say so in its diff.
MESSAGE_POST = {"sqlite": 17, "postgresql": 19}  # 19 and 21 until the owner was read again for the turn's zone


def test_a_message_post_keeps_its_statement_budget(alice_client, alice):
    conversation = conversation_for(alice)
    statements: list[str] = []

    def counted(execute, sql, params, many, context):
        if not CONTROL.match(sql):
            statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        response = alice_client.post(reverse("message_send", args=[conversation.pk]), {"text": "hello"},
                                     HTTP_HX_REQUEST="true")
    assert response.status_code == 204
    assert len(statements) == MESSAGE_POST[connection.vendor], "\n".join(sql[:120] for sql in statements)
