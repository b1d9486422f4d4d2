"""The chat's htmx posts and the audit pages: owners only, CSRF, clear refusals."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from orchestration.models import Turn
from tests.factories import conversation_for, turn_for


@pytest.fixture
def conversation(alice):
    return conversation_for(alice, title="Planning")


def htmx_post(client, url, data=None):
    return client.post(url, data or {}, HTTP_HX_REQUEST="true")


def test_send_message_starts_a_turn_and_leaves_the_panels_to_the_socket(alice_client, conversation):
    """An empty 204: the socket pushes the panels; a reply carrying them too raced the
    push (htmx:oobErrorNoTarget when the push had replaced the form first)."""
    response = htmx_post(alice_client, reverse("message_send", args=[conversation.pk]), {"text": "Hello"})
    assert response.status_code == 204
    assert response.content == b""
    assert Turn.objects.get(conversation=conversation).status == "running"


def test_second_message_while_running_is_refused_clearly(alice_client, conversation):
    turn_for(conversation)
    response = htmx_post(alice_client, reverse("message_send", args=[conversation.pk]), {"text": "again"})
    assert response.status_code == 409
    assert "still running" in response.content.decode()
    assert response["HX-Retarget"] == "#composer-error-slot"
    assert Turn.objects.filter(conversation=conversation).count() == 1


def test_empty_and_oversized_messages_are_refused(alice_client, conversation):
    url = reverse("message_send", args=[conversation.pk])
    assert "empty" in htmx_post(alice_client, url, {"text": "   "}).content.decode()
    assert "limit is 8000" in htmx_post(alice_client, url, {"text": "x" * 9000}).content.decode()
    assert not Turn.objects.exists()


def test_send_needs_csrf(alice, conversation):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("message_send", args=[conversation.pk]), {"text": "hi"}).status_code == 403
    assert not Turn.objects.exists()


@pytest.mark.parametrize("name", ["message_send", "turn_continue", "turn_stop"])
def test_other_users_posts_are_404_and_change_nothing(client, bob, conversation, name):
    turn = turn_for(conversation)
    client.force_login(bob)
    args = [conversation.pk] if name == "message_send" else [conversation.pk, turn.pk]
    assert client.post(reverse(name, args=args), {"text": "hi"}).status_code == 404
    turn.refresh_from_db()
    assert turn.status == "running" and Turn.objects.count() == 1


def test_turn_of_another_conversation_is_404(alice_client, alice, conversation):
    other_turn = turn_for(conversation_for(alice, title="Other"))
    url = reverse("turn_stop", args=[conversation.pk, other_turn.pk])
    assert alice_client.post(url).status_code == 404


def test_stop_a_running_turn(alice_client, conversation):
    turn = turn_for(conversation)
    response = htmx_post(alice_client, reverse("turn_stop", args=[conversation.pk, turn.pk]))
    assert response.status_code == 204
    turn.refresh_from_db()
    assert turn.status == "stopped"
    assert turn.messages.filter(content__startswith="Stopped at your request").exists()


@pytest.mark.parametrize("status, words", [("completed", "been answered"), ("failed", "failed"),
                                           ("stopped", "been stopped")])
def test_a_stop_that_arrives_after_the_turn_ended_is_news_not_an_error(alice_client, conversation, status, words):
    """Pressed as the turn ends: a 200 into the page's notice slot, which pushes do not
    replace (a 409 was a console error, and its message went into the composer the push
    that ended the turn was replacing)."""
    turn = turn_for(conversation, status=status)
    url = reverse("turn_stop", args=[conversation.pk, turn.pk])
    response = htmx_post(alice_client, url)
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#page-notice-slot"
    assert f"The turn had already {words} before the Stop reached it." in response.content.decode()
    page = alice_client.get(reverse("conversation_detail", args=[conversation.pk])).content.decode()
    assert 'id="page-notice-slot"' in page
    plain = alice_client.post(url, follow=True)  # without htmx: the page, with the notice
    assert plain.status_code == 200 and f"already {words}" in plain.content.decode()
    turn.refresh_from_db()
    assert turn.status == status and not turn.messages.exists()


def test_continue_without_a_pause_says_so(alice_client, conversation):
    turn = turn_for(conversation)
    response = htmx_post(alice_client, reverse("turn_continue", args=[conversation.pk, turn.pk]))
    assert response.status_code == 409
    assert "already resumed or stopped" in response.content.decode()


def test_audit_page_and_export(alice_client, conversation):
    turn_for(conversation)
    page = alice_client.get(reverse("conversation_audit", args=[conversation.pk]))
    assert page.status_code == 200 and "Turn 1" in page.content.decode()
    assert "0 of 6 orchestrator calls (a typical request takes 3)" in page.content.decode()
    export = alice_client.get(reverse("conversation_export", args=[conversation.pk]))
    assert export["Content-Disposition"].startswith("attachment;")
    turn = json.loads(export.content)["turns"][0]
    assert turn["number"] == 1
    assert turn["counters"] == {"agents": 0, "skill_calls": 0, "llm_iterations": 0, "llm_iterations_allowed": 6,
                                "llm_iterations_typical": 3}


@pytest.mark.parametrize("name", ["conversation_audit", "conversation_export"])
def test_audit_is_owner_only(client, bob, conversation, name):
    client.force_login(bob)
    assert client.get(reverse(name, args=[conversation.pk])).status_code == 404


def test_pages_carry_a_strict_content_security_policy(alice_client, conversation):
    policy = alice_client.get(conversation.get_absolute_url())["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("style-src")[0]


def test_staff_audit_links_into_the_admin(client, staff, conversation):
    conversation.owner = staff
    conversation.save()
    client.force_login(staff)
    page = client.get(reverse("conversation_audit", args=[conversation.pk])).content.decode()
    assert reverse("admin:orchestration_conversation_change", args=[conversation.pk]) in page


def test_staff_can_read_any_audit_trail_and_admin_links_to_it(client, staff, conversation):
    client.force_login(staff)
    assert client.get(reverse("conversation_audit", args=[conversation.pk])).status_code == 200
    admin_page = client.get(reverse("admin:orchestration_conversation_change", args=[conversation.pk]))
    assert reverse("conversation_audit", args=[conversation.pk]) in admin_page.content.decode()
    # reading the trail does not open the conversation itself
    assert client.get(conversation.get_absolute_url()).status_code == 404


def test_the_audit_counts_in_words_that_agree_with_the_number(alice_client, conversation):
    turn_for(conversation, agents_dispatched=1, skill_calls=1, status="completed")
    turn_for(conversation, agents_dispatched=2, skill_calls=3, status="completed")
    page = alice_client.get(reverse("conversation_audit", args=[conversation.pk])).content.decode()
    assert "1 agent · 1 skill call ·" in page and "2 agents · 3 skill calls ·" in page


def test_an_agent_that_never_ran_shows_no_duration_in_the_audit(alice_client, conversation):
    from tests.factories import dispatch_for

    turn = turn_for(conversation, status="stopped")
    dispatch_for(turn, "never-ran", state="closed", outcome="cancelled", duration_ms=None)
    dispatch_for(turn, "ran", state="closed", outcome="completed", duration_ms=4200)
    page = alice_client.get(reverse("conversation_audit", args=[conversation.pk])).content.decode()
    assert "- ms" not in page and "None ms" not in page
    assert "skill calls used · 4.2 s ·" in page
