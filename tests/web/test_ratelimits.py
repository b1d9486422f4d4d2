"""Requests per user per hour (assistant/ratelimits.py): new conversations and messages.

The abuse: one account made 1,000 conversations in 6 s and started 150 turns in 5.5 s.
Now the request past the limit gets 429 with Retry-After and a message (in the composer
for htmx, on the site's page for a plain form), never a 500; refused or invalid posts cost
no allowance; deleting conversations gives none back; other users are unaffected; and
concurrent posts cannot overshoot.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from assistant.models import RequestStamp
from orchestration.models import Conversation, Turn
from tests.factories import conversation_for, turn_for


@pytest.fixture
def limits(settings):
    settings.ASSISTANT_RATE_LIMITS = {"conversation": 3, "message": 2}
    settings.ASSISTANT_RATE_WINDOW_SECONDS = 3600
    return settings.ASSISTANT_RATE_LIMITS


def create(client):
    return client.post(reverse("conversation_create"))


def send(client, conversation, text="Hello", *, htmx=True):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    return client.post(reverse("message_send", args=[conversation.pk]), {"text": text}, **headers)


def test_new_conversations_past_the_limit_get_a_429_page_with_retry_after(limits, alice_client, alice):
    assert [create(alice_client).status_code for _ in range(3)] == [302, 302, 302]
    refused = create(alice_client)
    assert refused.status_code == 429
    assert 3500 <= int(refused["Retry-After"]) <= 3600
    page = refused.content.decode()
    assert "Too many requests" in page and "You have started 3 new conversations in the last hour" in page
    assert "Try again in 1 hour" in page or "Try again in 60 minutes" in page
    assert "Back to your conversations" in page  # the site's own page, with a way back
    assert Conversation.objects.filter(owner=alice).count() == 3


def test_another_users_allowance_is_their_own(limits, alice_client, bob):
    for _ in range(4):
        create(alice_client)
    other = Client()
    other.force_login(bob)
    assert create(other).status_code == 302
    conversation = Conversation.objects.get(owner=bob)
    assert send(other, conversation).status_code == 204
    assert other.get(conversation.get_absolute_url()).status_code == 200


def test_an_htmx_message_past_the_limit_shows_in_the_composer(limits, alice_client, alice):
    """The same slot a 409 ("still running") uses; base.html lets htmx swap a 429 in."""
    chats = [conversation_for(alice, title=f"chat {i}") for i in range(3)]
    assert [send(alice_client, chat).status_code for chat in chats[:2]] == [204, 204]
    refused = send(alice_client, chats[2], "one more")
    assert refused.status_code == 429
    assert refused["HX-Retarget"] == "#composer-error-slot" and refused["HX-Reswap"] == "innerHTML"
    assert int(refused["Retry-After"]) > 0
    body = refused.content.decode()
    assert body.startswith('<p class="notice error" id="composer-error">')
    assert "2 messages in the last hour" in body
    assert not Turn.objects.filter(conversation=chats[2]).exists()


def test_a_plain_form_message_past_the_limit_keeps_the_text_to_send_again(limits, alice_client, alice):
    chats = [conversation_for(alice, title=f"chat {i}") for i in range(3)]
    for chat in chats[:2]:
        send(alice_client, chat, htmx=False)
    refused = send(alice_client, chats[2], "Book <the> review", htmx=False)
    assert refused.status_code == 429 and refused["Retry-After"]
    page = refused.content.decode()
    assert "Book &lt;the&gt; review</textarea>" in page  # nothing typed is lost
    assert f'action="{reverse("message_send", args=[chats[2].pk])}"' in page
    assert f'href="{chats[2].get_absolute_url()}"' in page


def test_refused_and_invalid_messages_cost_no_allowance(limits, alice_client, alice):
    busy = conversation_for(alice, title="busy")
    turn_for(busy)  # a turn still running: the next message is refused with 409
    for _ in range(5):
        assert send(alice_client, busy, "again").status_code == 409
        assert send(alice_client, conversation_for(alice), "   ").status_code == 409  # empty
    assert not RequestStamp.objects.exists()
    assert send(alice_client, conversation_for(alice)).status_code == 204


def test_deleting_conversations_gives_no_allowance_back(limits, alice_client, alice):
    for _ in range(3):
        create(alice_client)
    Conversation.objects.filter(owner=alice).delete()
    assert create(alice_client).status_code == 429


def test_the_window_slides(limits, alice_client, alice):
    """Each request ages out an hour after it was made; Retry-After is when the oldest does."""
    for _ in range(3):
        create(alice_client)
    now = timezone.now()
    oldest, *_ = RequestStamp.objects.filter(user=alice).order_by("at")
    RequestStamp.objects.filter(pk=oldest.pk).update(at=now - timedelta(minutes=50))
    refused = create(alice_client)
    assert refused.status_code == 429
    assert 590 <= int(refused["Retry-After"]) <= 600
    RequestStamp.objects.filter(pk=oldest.pk).update(at=now - timedelta(minutes=61))
    assert create(alice_client).status_code == 302
    assert create(alice_client).status_code == 429
    assert RequestStamp.objects.filter(user=alice).count() == 3  # aged-out stamps are removed


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_cannot_overshoot(settings, alice, bob):
    """Twelve of alice's posts at once, from six threads with their own connections:
    exactly the limit are admitted; the rest get 429, none a 500. Bob's post in the same
    burst is admitted."""
    settings.ASSISTANT_RATE_LIMITS = {"conversation": 5, "message": 5}
    barrier = threading.Barrier(7)
    statuses: dict[str, list[int]] = {"alice": [], "bob": []}

    def flood(user, name, count):
        client = Client()
        client.force_login(user)
        barrier.wait()
        try:
            for _ in range(count):
                statuses[name].append(create(client).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=flood, args=(alice, "alice", 2)) for _ in range(6)]
    threads.append(threading.Thread(target=flood, args=(bob, "bob", 1)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses["alice"]) == [302] * 5 + [429] * 7
    assert statuses["bob"] == [302]
    assert Conversation.objects.filter(owner=alice).count() == 5


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_message_sent_while_a_mail_goes_out_in_that_conversation_does_not_deadlock(alice):
    """A skill's transaction locks its conversation, then its owner's capped-write lock
    (the email skill's daily cap, skills/egress.py). A message posted to that conversation
    meanwhile waits for the conversation, and must not hold what the skill needs next:
    when the post held the owner's row, which that lock then was, PostgreSQL broke the
    deadlock by failing one side (a 500, or the mail)."""
    from django.db import connection as main_connection
    from django.db import transaction

    from skills.egress import reserve_daily
    from tests.live.conftest import wait_for

    conversation = conversation_for(alice)
    skill_holds_conversation = threading.Event()
    answered: list[int] = []

    def post():
        client = Client()
        client.force_login(alice)
        skill_holds_conversation.wait()
        try:
            answered.append(send(client, conversation).status_code)
        finally:
            connection.close()

    def someone_waits_on_a_lock() -> bool:
        with main_connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one snapshot per transaction
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
            return cursor.fetchone()[0] > 0

    poster = threading.Thread(target=post)
    poster.start()
    try:
        with transaction.atomic():
            Conversation.objects.select_for_update(no_key=True).filter(pk=conversation.pk).values_list("pk").first()
            skill_holds_conversation.set()
            wait_for(someone_waits_on_a_lock, timeout=30, what="the post to wait for the conversation")
            reserve_daily(alice, ["bob@example.com"])
    finally:
        skill_holds_conversation.set()
        poster.join(timeout=60)
    assert answered == [204]
