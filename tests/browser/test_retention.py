"""An owner deletes a conversation from its page in chromium (issue 18): "Delete…", the
confirm step says what goes, "Delete for good" posts the form, and the list no longer
has it; a conversation whose turn is waiting for the owner cannot be deleted yet."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from orchestration.models import Conversation, Event
from orchestration.records.events import event_record
from tests.factories import conversation_for, turn_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def with_a_turn(user, title: str, status: str) -> Conversation:
    conversation = conversation_for(user, title=title)
    event_record(type="turn.started", turn=turn_for(conversation, status=status), summary="Turn 1 started")
    return conversation


def test_the_owner_deletes_a_conversation_from_its_page(servers, visit, alice, bob):
    old = with_a_turn(alice, "Old plans", "completed")
    waiting = with_a_turn(alice, "Waiting plans", "paused")
    bobs = with_a_turn(bob, "Bob's plans", "completed")
    tab = visit(servers(workers=0), "alice")

    tab.goto(f"/conversations/{old.pk}/")
    tab.page.click("#conversation-delete-link")
    expect(tab.page.locator("#delete-conversation")).to_contain_text("1 turn, 0 messages and 1 event")
    tab.page.click("#delete-confirm")
    expect(tab.page.locator(".notice")).to_contain_text("Deleted “Old plans” and everything in it.")
    expect(tab.page.locator(".conversations")).not_to_contain_text("Old plans")
    expect(tab.page.locator(".conversations")).to_contain_text("Waiting plans")
    assert not Conversation.objects.filter(pk=old.pk).exists()
    tab.page.wait_for_load_state("load")  # its scripts loaded: leaving now aborts none of them

    tab.goto(f"/conversations/{waiting.pk}/delete/")
    expect(tab.page.locator("#delete-refused")).to_contain_text("stop it first")
    expect(tab.page.locator("#delete-confirm")).to_have_count(0)
    assert Event.objects.filter(conversation=waiting).exists() and Event.objects.filter(conversation=bobs).exists()
