"""Every page: works for the owner, 404 for another user, login page for anonymous."""

import pytest
from django.urls import reverse

from orchestration.models import Conversation, Message
from tests.factories import conversation_for


@pytest.fixture
def conversation(alice):
    conversation = conversation_for(alice, title="Weekly planning")
    Message.objects.create(conversation=conversation, seq=1, role="user", content="Hello there")
    return conversation


def test_list_shows_only_own_conversations(alice_client, conversation, bob):
    conversation_for(bob, title="Bob's secret plans")
    page = alice_client.get(reverse("conversation_list"))
    assert page.status_code == 200
    assert b"Weekly planning" in page.content
    assert b"secret plans" not in page.content


def test_create_conversation_redirects_to_it(alice_client, alice):
    response = alice_client.post(reverse("conversation_create"))
    conversation = Conversation.objects.get(owner=alice)
    assert response.status_code == 302
    assert response.url == conversation.get_absolute_url()


def test_create_needs_post(alice_client):
    assert alice_client.get(reverse("conversation_create")).status_code == 405


def test_create_needs_csrf(alice, db):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("conversation_create")).status_code == 403
    assert not Conversation.objects.exists()


def test_owner_sees_conversation(alice_client, conversation):
    page = alice_client.get(conversation.get_absolute_url())
    assert page.status_code == 200
    assert b"Hello there" in page.content


def test_other_user_gets_404(client, conversation, bob):
    client.force_login(bob)
    assert client.get(conversation.get_absolute_url()).status_code == 404


def test_missing_conversation_is_404(alice_client):
    assert alice_client.get(reverse("conversation_detail", args=[999999])).status_code == 404


@pytest.mark.parametrize("name", ["conversation_list", "conversation_detail"])
def test_anonymous_is_sent_to_login(client, conversation, name):
    args = [conversation.pk] if name == "conversation_detail" else []
    response = client.get(reverse(name, args=args))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_login_and_logout(client, alice):
    from tests.conftest import PASSWORD

    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("conversation_list")).status_code == 200
    client.post(reverse("logout"))
    assert client.get(reverse("conversation_list")).status_code == 302


def test_wrong_password_is_refused(client, alice):
    response = client.post(reverse("login"), {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b"match. Please try again" in response.content


def test_a_reload_mid_stream_shows_the_answer_so_far_sanitised(alice_client, conversation):
    from tests.factories import turn_for

    turn_for(conversation, answer_draft="Half of the **answer** <script>alert(1)</script>")
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert 'id="answer-draft"' in html and "Half of the <strong>answer</strong>" in html
    assert "<script>alert" not in html


def test_a_running_turn_without_a_draft_says_the_assistant_is_working(alice_client, conversation):
    from tests.factories import turn_for

    turn_for(conversation)
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert 'id="answer-draft"' in html and "The assistant is working" in html
