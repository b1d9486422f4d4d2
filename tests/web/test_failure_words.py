"""Errors reach people in plain words; the technical text stays one click away (issue 28
item 3): in the chat, the timeline, the waterfall and the audit alike."""

from __future__ import annotations

import pytest
from django.urls import reverse

from assistant.templatetags.rendering import failure
from orchestration.lifecycle.turns import turn_fail
from orchestration.models import Event
from orchestration.reports.errors import failure_of
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db

SDK_503 = "LLM error 503: Error code: 503 - {'error': {'message': 'overloaded', 'type': 'scripted'}}"


@pytest.mark.parametrize("stored, words", [
    (f"The model could not be reached: {SDK_503}", "The model service had an error on its side (HTTP 503)."),
    (f"LLM error: {SDK_503}", "The model service had an error on its side (HTTP 503)."),
    ("LLM error: LLM error 400: Error code: 400 - context too long", "The model service refused the request (HTTP 400)."),
    ("LLM error: LLM rate limit: Error code: 429", "The model service is limiting requests and asked to slow down."),
    ("LLM error: LLM quota exhausted: insufficient_quota", "The model account has run out of quota."),
    ("LLM error: LLM endpoint unreachable: Connection error.", "The model service could not be reached."),
    ("LLM error: LLM stream interrupted: ReadTimeout()", "The model's answer broke off before it was complete."),
])
def test_the_model_services_failures_read_as_sentences_with_their_detail(stored, words):
    found = failure_of(stored)
    assert found.words == words
    assert found.detail.startswith("LLM ") and "could not be reached" not in found.detail


def test_other_errors_are_shown_as_written_and_the_detail_is_escaped():
    assert failure_of("no answer within the engine's step limit").detail == ""
    assert failure("wall-clock limit of 60s reached") == "wall-clock limit of 60s reached"
    html = failure("LLM error: LLM error 502: <b>bad gateway</b>")
    assert html.startswith("The model service had an error on its side (HTTP 502). <details")
    assert "&lt;b&gt;bad gateway&lt;/b&gt;" in html and "<b>" not in html


def test_a_failed_turn_says_it_in_words_and_keeps_the_detail_for_the_audit(alice, alice_client):
    conversation = conversation_for(alice)
    turn = turn_for(conversation)
    dispatch_for(turn, "finder", state="closed", outcome="failed", error=f"LLM error: {SDK_503}")
    turn_fail(turn_id=turn.pk, error=f"The model could not be reached: {SDK_503}")

    notice = turn.messages.get(role="notice").content
    assert notice == "Sorry — this turn failed. The model service had an error on its side (HTTP 503)."
    event = Event.objects.get(turn=turn, type="turn.failed")
    assert event.summary == "Turn 1 failed: The model service had an error on its side (HTTP 503)."
    assert event.payload["error"].endswith(SDK_503)  # in the row's disclosure

    for url in (reverse("conversation_detail", args=[conversation.pk]),
                reverse("conversation_audit", args=[conversation.pk])):
        page = alice_client.get(url).content.decode()
        assert "The model service had an error on its side (HTTP 503)." in page
        assert "Error code: 503" in page.split("<details", 1)[1]  # the detail, behind a disclosure
        assert "LLM error 503" not in page.split("<details", 1)[0]


def test_tool_arguments_read_as_indented_json_not_one_escaped_line():
    from assistant.payloads import render_payload
    from orchestration.records.output import json_unwrapped

    arguments = '{"agent_id": "mailer", "skills": ["email.send"]}'
    html = render_payload({"tool_calls": [{"name": "dispatch_agent", "arguments": arguments}]})
    assert '\\&quot;' not in html and "&quot;agent_id&quot;: &quot;mailer&quot;" in html
    assert json_unwrapped({"a": ["[1, 2]", "not {json"]}) == {"a": [[1, 2], "not {json"]}
    assert json_unwrapped("{broken") == "{broken"
