"""A spent allowance in chromium: the prompt says what is left and when it renews,
Continue is refused beside the composer while it is spent, and goes on once staff
raise the allowance (issue 18)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from orchestration.models import SpendAllowance, TurnPause
from tests.browser.conftest import wait_turn
from tests.factories import spent
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_spent_allowance_pauses_and_continue_waits_for_more(servers, visit, alice, llm, request):
    llm.respond = Plan([Agent("finder", ["tasks.search"], [("tasks.search", {"status": "open"})])],
                       answer="No open tasks.")
    spent(alice, day=99_500)
    site = servers(env={"SPEND_TOKENS_PER_DAY": "100000"})
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page

    alice_tab.send("Any open tasks?")

    prompt = page.locator("#pause-prompt .pause")
    expect(prompt).to_contain_text("You have used 99,500 tokens of your 100,000 tokens today: 500 tokens left")
    expect(prompt).to_contain_text("Your allowance renews at midnight")
    expect(prompt).to_contain_text("Continue cannot pass this cap")
    assert llm.requests == []  # nothing was asked of the model
    alice_tab.screenshot(request.node, "spent", "#pause-prompt")

    alice_tab.expect_failure(r"409")  # the refusal is a 409 the page shows beside the composer
    page.click("#continue-button")
    expect(page.locator("#composer-error")).to_contain_text("Your daily allowance is still spent: 500 tokens")
    expect(prompt).to_be_visible()  # still paused, still asking
    assert TurnPause.objects.get(turn__conversation_id=conversation_id).decision == ""

    SpendAllowance.objects.create(user=alice, tokens_per_day=1_000_000)  # staff raise it
    page.click("#continue-button")
    expect(page.locator("#messages .message.assistant", has_text="No open tasks.")).to_be_visible()
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    expect(page.locator("#messages .notice", has_text="Turn 1 paused")).to_contain_text(
        "your daily token allowance: alice continued it.")
