"""Bad chat input: refused with a clear message, nothing stored, the typed text not lost.

The limits live in the service (orchestration.lifecycle.turns.turn_start), so every way in — the
page, htmx, `manage.py ask` — gets the same refusal.
"""

from __future__ import annotations

import re

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils.html import escape

from orchestration.models import Event, Message, Turn
from orchestration.lifecycle.turns import MAX_MESSAGE_CHARS
from tests.factories import conversation_for


@pytest.fixture
def conversation(alice):
    return conversation_for(alice, title="Planning")


@pytest.fixture
def send(alice_client, conversation):
    url = reverse("message_send", args=[conversation.pk])

    def send(text: str, *, htmx: bool = True):
        headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
        return alice_client.post(url, {"text": text}, **headers)

    return send


def nothing_stored() -> bool:
    return not (Turn.objects.exists() or Message.objects.exists() or Event.objects.exists())


REFUSED = [
    ("x" * (MAX_MESSAGE_CHARS + 1),
     f"The message is {MAX_MESSAGE_CHARS + 1} characters; the limit is {MAX_MESSAGE_CHARS}."),
    ("é" * (MAX_MESSAGE_CHARS + 1), f"the limit is {MAX_MESSAGE_CHARS}"),
    ("before\x00after", "The message cannot be stored: text must not contain NUL characters."),
    ("\x00", "The message cannot be stored: text must not contain NUL characters."),
    (" \n\t ", "The message is empty."),
]


@pytest.mark.parametrize(("text", "error"), REFUSED, ids=["long", "long-multibyte", "NUL", "only-NUL", "blank"])
def test_htmx_refusal_is_shown_in_place_and_keeps_the_typed_text(send, text, error):
    """409 with the error retargeted into the composer's error slot: the composer itself
    (and so the text being typed) is not swapped out."""
    response = send(text)
    assert response.status_code == 409
    assert response["HX-Retarget"] == "#composer-error-slot"
    body = response.content.decode()
    assert error in body
    assert 'id="composer"' not in body and "hx-swap-oob" not in body
    assert nothing_stored()


@pytest.mark.parametrize(("text", "error"), REFUSED[:3], ids=["long", "long-multibyte", "NUL"])
def test_a_plain_form_refusal_is_flashed_on_the_conversation(alice_client, conversation, text, error):
    url = reverse("message_send", args=[conversation.pk])
    response = alice_client.post(url, {"text": text}, follow=True)
    assert response.redirect_chain == [(conversation.get_absolute_url(), 302)]
    assert escape(error) in response.content.decode()
    assert nothing_stored()


def test_a_message_at_the_limit_is_accepted(send):
    assert send("y" * MAX_MESSAGE_CHARS).status_code == 204
    assert Turn.objects.get().status == "running"
    assert Message.objects.get().content == "y" * MAX_MESSAGE_CHARS


def test_the_page_tells_the_browser_the_same_limit(alice_client, conversation):
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert re.search(r'<textarea name="text"[^>]* maxlength="(\d+)"', page)[1] == str(MAX_MESSAGE_CHARS)


def test_a_body_beyond_djangos_upload_limit_is_400_and_stores_nothing(send, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    assert send("z" * 60_000).status_code == 400
    assert nothing_stored()


@pytest.mark.parametrize("text", ["x" * (MAX_MESSAGE_CHARS + 1), "nul\x00here"])
def test_ask_refuses_it_the_same_way(alice, text):
    with pytest.raises(CommandError, match="limit is|cannot be stored"):
        call_command("ask", text, user="alice")
    assert not Turn.objects.exists()
