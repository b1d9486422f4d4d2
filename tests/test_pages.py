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


# --- continue? in plain words, once -------------------------------------------------------

@pytest.fixture
def paused_on_agents(alice):
    """A turn paused at its agent limit the way the engine leaves it: the pause, its chat record."""
    from orchestration.models import Turn, TurnPause

    conversation = conversation_for(alice, title="Plan the trip")
    turn = Turn.objects.create(conversation=conversation, number=1, status="paused")
    Message.objects.create(conversation=conversation, turn=turn, seq=1, role="user", content="Plan the trip")
    Message.objects.create(conversation=conversation, turn=turn, seq=2, role="notice",
                           content="Turn 1 paused on agents per turn: waiting for your answer below.")
    TurnPause.objects.create(turn=turn, limit="turn_max_agents", detail={
        "message": "This turn may dispatch 8 agents; 3 more were asked for.", "limit": 8, "used": 6,
        "requested": 3, "asked_for": ["flights", "hotels", "trains"], "completed": ["weather"],
        "running": ["budget"], "not_started": []})
    return conversation


def test_the_continue_prompt_reads_in_words_and_appears_once(alice_client, paused_on_agents):
    html = alice_client.get(paused_on_agents.get_absolute_url()).content.decode()
    assert html.count("Continue?") == 1
    assert "turn_max_agents" not in html
    assert "This turn may start 8 agents in all: it has started 6 agents and asked for another 3 agents." in html
    assert "Done: weather" in html and "Still working: budget" in html
    assert "Waiting to start: flights, hotels, trains" in html
    assert "Not started yet: none" not in html
    assert "Continue allows 8 more agents for this turn." in html  # one default's worth (settings: 8)


def test_an_answered_pause_reads_in_words(alice_client, paused_on_agents, alice):
    from django.utils import timezone

    from orchestration.models import TurnPause

    from orchestration.questions.pauses import pause_recorded

    TurnPause.objects.update(decision="continue", decided_by=alice, decided_at=timezone.now())
    pause_recorded(TurnPause.objects.get().pk)  # as the answer does, in its transaction
    html = alice_client.get(paused_on_agents.get_absolute_url()).content.decode()
    assert html.count("Turn 1 paused on agents per turn") == 1  # one line, at its turn, not a pile above the composer
    assert "Turn 1 paused on agents per turn: alice continued it." in html
    assert "turn_max_agents" not in html and "Continue?" not in html


# --- conversations people can tell apart ----------------------------------------------------

def test_the_list_shows_each_conversations_state_and_last_activity(alice_client, alice):
    from datetime import timedelta

    from django.utils import timezone

    from orchestration.models import Conversation, Turn

    answered = conversation_for(alice, title="Renew passport")
    Turn.objects.create(conversation=answered, number=1, status="completed")
    Conversation.objects.filter(pk=answered.pk).update(updated_at=timezone.now() - timedelta(minutes=5, seconds=3))
    paused = conversation_for(alice, title="Plan the trip")
    Turn.objects.create(conversation=paused, number=1, status="paused")
    untitled = conversation_for(alice, title="")
    html = alice_client.get(reverse("conversation_list")).content.decode().replace("\xa0", " ")
    row = html[html.index(f'id="conversation-{answered.pk}"'):]
    assert "answered" in row[:400] and "5 minutes ago" in row[:400]
    assert "waiting for you" in html[html.index(f'id="conversation-{paused.pk}"'):][:400]
    fresh = html[html.index(f'id="conversation-{untitled.pk}"'):][:400]
    assert "New conversation · " in fresh and "just now" in fresh and "no messages yet" in fresh
    assert "0 minutes ago" not in html and f"Conversation {untitled.pk}" not in html


def test_an_answer_whose_agent_failed_is_not_badged_plain_answered(alice_client, alice):
    from orchestration.models import Turn
    from tests.factories import dispatch_for

    title = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"
    partial = conversation_for(alice, title=title)
    dispatch_for(Turn.objects.create(conversation=partial, number=1, status="failed"), "old", outcome="failed")
    dispatch_for(Turn.objects.create(conversation=partial, number=2, status="completed"), "mailer", outcome="failed")
    whole = conversation_for(alice, title="Renew passport")
    dispatch_for(Turn.objects.create(conversation=whole, number=1, status="completed"), "finder", outcome="completed")
    html = alice_client.get(reverse("conversation_list")).content.decode()
    row = html[html.index(f'id="conversation-{partial.pk}"'):][:700]
    assert f'title="{title}">{title}</a>' in row  # whole, for the line's ellipsis and the hover
    assert '<span class="state state-partial">answered, an agent failed</span>' in row
    assert '<span class="state state-completed">answered</span>' in html[html.index(f'id="conversation-{whole.pk}"'):][:400]


def test_an_empty_conversation_offers_example_requests_that_post(alice_client, alice):
    conversation = conversation_for(alice, title="")
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    send = reverse("message_send", args=[conversation.pk])
    assert html.count('class="secondary suggestion"') == 4
    assert 'name="text" value="add a task: renew passport"' in html
    assert f'hx-post="{send}"' in html.split('id="suggestions"')[1].split("</div>")[0]


def test_the_counters_hide_zeros_and_use_plurals(alice_client, alice):
    from orchestration.models import LLMCall, Turn

    conversation = conversation_for(alice)
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    counters = html[html.index('id="counters"'):].split("</div>")[0]
    assert "token" not in counters and "0" not in counters.split(">", 1)[1]
    turn = Turn.objects.create(conversation=conversation, number=1, status="completed")
    LLMCall.objects.create(turn=turn, key="k1", prompt_tokens=1, completion_tokens=0)
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert "1 token (1 in, 0 out)" in html


def test_the_heading_takes_the_title_live(alice):
    """The socket holds the conversation from before its first request: the push names it."""
    from assistant.live import render_events
    from orchestration.models import Conversation, Event
    from orchestration.lifecycle.turns import turn_start

    held = conversation_for(alice, title="")
    turn_start(conversation=Conversation.objects.get(pk=held.pk), text="add a task:\n  renew   passport")
    html = render_events(held, list(Event.objects.filter(conversation=held)))
    assert '<h1 id="conversation-title" hx-swap-oob="true">add a task:</h1>' in html


def test_the_page_says_the_conversation_carries_outside_content_and_since_when(alice_client, alice):
    """In the owner's zone, on the page and in the push after the turn that read it (the
    socket holds its conversation from before that turn ended)."""
    from datetime import UTC, datetime

    from django.utils import timezone

    from assistant.live import render_events
    from assistant.preferences import preferences_time_zone_set
    from orchestration.models import Event
    from tests.factories import turn_for

    preferences_time_zone_set(user=alice, time_zone="Pacific/Auckland")  # UTC+13 in November
    held = conversation_for(alice)
    html = alice_client.get(held.get_absolute_url()).content.decode()
    assert '<div id="conversation-outside">' in html and "text you did not write" not in html

    Conversation.objects.filter(pk=held.pk).update(outside=["file notes.txt", "task 3 (written from file notes.txt)"],
                                                   outside_since=datetime(2026, 11, 25, 22, 53, tzinfo=UTC))
    said = ("Since 26 Nov 2026, 11:53 this conversation holds text you did not write, which may carry "
            "instructions: file notes.txt; task 3 (written from file notes.txt). From then on, anything the "
            "assistant would change or send here asks you first.")
    assert said in " ".join(alice_client.get(held.get_absolute_url()).content.decode().split())

    ended = Event.objects.create(conversation=held, turn=turn_for(held, status="completed"), type="turn.completed",
                                 summary="Turn 1 answered")
    with timezone.override("Pacific/Auckland"):
        pushed = render_events(held, [ended])
    assert '<div id="conversation-outside" hx-swap-oob="true">' in pushed and said in " ".join(pushed.split())
