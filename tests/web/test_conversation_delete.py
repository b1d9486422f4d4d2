"""An owner deletes a conversation from its page (issue 18): a confirm step that says what
goes, a plain POST form with CSRF, refused while a turn runs or waits, 404 for anyone else.
(The access and CSRF sweeps cover the route too.)"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from orchestration.models import Conversation, Event, LLMCall, Message, Turn
from tests.factories import conversation_for, dispatch_for, turn_for


def conversation_with_a_trail(user, *, status: str = "completed", title: str = "Plans") -> Conversation:
    conversation = conversation_for(user, title=title)
    turn = turn_for(conversation, status=status)
    dispatch = dispatch_for(turn)
    Message.objects.create(conversation=conversation, turn=turn, seq=1, role="user", content="my secret")
    Event.objects.create(conversation=conversation, turn=turn, type="turn.started", summary="Turn 1 started")
    Event.objects.create(conversation=conversation, turn=turn, dispatch=dispatch, type="agent.subagent_created",
                         summary="a1 created")
    LLMCall.objects.create(turn=turn, dispatch=dispatch, key="a1:1", prompt_tokens=10)
    return conversation


def delete_url(conversation) -> str:
    return reverse("conversation_delete", args=[conversation.pk])


def test_the_page_links_to_a_confirm_step_that_says_what_goes(alice_client, alice):
    conversation = conversation_with_a_trail(alice)
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert f'href="{delete_url(conversation)}"' in page
    confirm = alice_client.get(delete_url(conversation))
    assert confirm.status_code == 200
    text = " ".join(confirm.content.decode().split())
    assert "1 turn, 1 message and 2 events" in text and 'id="delete-confirm"' in text
    assert "csrfmiddlewaretoken" in text
    assert Conversation.objects.filter(pk=conversation.pk).exists()  # a GET deletes nothing


def test_the_owner_deletes_it_and_bobs_are_untouched(alice_client, alice, bob):
    conversation = conversation_with_a_trail(alice)
    bobs = conversation_with_a_trail(bob, title="Bob's")
    response = alice_client.post(delete_url(conversation), follow=True)
    assert response.redirect_chain[-1][0] == reverse("conversation_list")
    assert "Deleted “Plans” and everything in it." in response.content.decode()
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Event.objects.filter(conversation_id=conversation.pk).exists()
    assert not Turn.objects.filter(conversation_id=conversation.pk).exists()
    assert Event.objects.filter(conversation=bobs).count() == 2 and bobs.turns.count() == 1
    assert alice_client.get(conversation.get_absolute_url()).status_code == 404


@pytest.mark.parametrize("status", ["running", "paused"])
def test_refused_while_a_turn_is_active(alice_client, alice, status):
    conversation = conversation_with_a_trail(alice, status=status)
    confirm = alice_client.get(delete_url(conversation)).content.decode()
    assert "stop it first" in confirm and 'id="delete-confirm"' not in confirm
    response = alice_client.post(delete_url(conversation))
    assert response.status_code == 409 and "stop it first" in response.content.decode()
    assert Event.objects.filter(conversation=conversation).count() == 2


def test_another_user_gets_404_and_deletes_nothing(client, alice, bob, staff, superuser):
    conversation = conversation_with_a_trail(alice)
    for visitor in (bob, staff, superuser):
        client.force_login(visitor)
        assert client.get(delete_url(conversation)).status_code == 404
        assert client.post(delete_url(conversation)).status_code == 404
    assert Event.objects.filter(conversation=conversation).count() == 2


def test_csrf_is_required(alice):
    conversation = conversation_with_a_trail(alice)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(delete_url(conversation)).status_code == 403
    assert Conversation.objects.filter(pk=conversation.pk).exists()
