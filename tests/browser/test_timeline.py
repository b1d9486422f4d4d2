"""The live timeline follows the run: rows in event-id order, the box kept at its bottom
while the user is there, a "jump to latest" when they scrolled up; and no flow (send,
continue, stop, reload) logs a console error or fails a request — the `visit` fixture
checks that after every test."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from orchestration.models import Conversation, TurnStatus
from tests.browser.conftest import assert_timeline_complete, record_events, wait_turn
from tests.browser.test_dashboard import slowed
from tests.factories import turn_for
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

AT_BOTTOM = "() => { const el = document.getElementById('timeline'); " \
            "return el.scrollHeight > el.clientHeight && el.scrollHeight - el.scrollTop - el.clientHeight < 8; }"


def test_the_timeline_follows_at_the_bottom_and_offers_a_jump_when_scrolled_up(servers, visit, alice):
    alice_tab = visit(servers(workers=0), "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page
    turn = turn_for(Conversation.objects.get(pk=conversation_id), status=TurnStatus.COMPLETED)
    jump = page.locator("#timeline-jump")

    first = record_events(turn, 60)  # more rows than the box shows
    page.wait_for_selector(f"#event-{max(first)}", state="attached")
    page.wait_for_function(AT_BOTTOM)
    expect(jump).to_be_hidden()

    # as the user's wheel would (the scroll event itself comes a frame later)
    page.eval_on_selector("#timeline", "el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    later = record_events(turn, 3)
    page.wait_for_selector(f"#event-{max(later)}", state="attached")
    expect(jump).to_be_visible()
    assert page.eval_on_selector("#timeline", "el => el.scrollTop") == 0  # the user's place is kept

    jump.click()
    page.wait_for_function(AT_BOTTOM)
    expect(jump).to_be_hidden()
    newest = record_events(turn, 2)
    page.wait_for_selector(f"#event-{max(newest)}", state="attached")
    page.wait_for_function(AT_BOTTOM)  # following again
    assert_timeline_complete(alice_tab, conversation_id)

    page.reload()  # the first render starts at the newest row too
    alice_tab.wait_connected()
    page.wait_for_function(AT_BOTTOM)
    assert_timeline_complete(alice_tab, conversation_id)


def test_a_row_that_arrives_late_takes_its_place_by_id(servers, visit, alice):
    """On PostgreSQL a smaller id can commit after a larger one: the page puts its row
    before the first row with a larger id, not at the end (static/js/live.js)."""
    alice_tab = visit(servers(workers=0), "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page
    turn = turn_for(Conversation.objects.get(pk=conversation_id), status=TurnStatus.COMPLETED)
    ids = sorted(record_events(turn, 4))
    page.wait_for_selector(f"#event-{ids[-1]}", state="attached")
    # as if ids[1] had not reached the page yet: take it out, then replay it as a push would
    row = page.eval_on_selector(f"#event-{ids[1]}", "el => { const html = el.outerHTML; el.remove(); return html; }")
    page.evaluate("html => htmx.swap('#timeline', html, {swapStyle: 'none'}, {})",
                  f'<div hx-swap-oob="beforeend:#timeline">{row}</div>')
    assert alice_tab.event_ids() == ids


def test_stop_a_running_turn_then_reload_logs_no_error(servers, visit, alice, llm):
    slow = Agent("slow", ["tasks.search"], [("tasks.search", {"status": "open"})] * 3)
    llm.respond = slowed(Plan([slow], answer="Searched."), 2.0)
    site = servers()
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page

    alice_tab.send("Search slowly")
    expect(page.locator("#composer textarea")).to_have_value("")
    with page.expect_response(lambda r: r.url.endswith("/stop/")) as stopped:
        page.click("#stop-turn-button")
    assert stopped.value.status == 204
    expect(page.locator("#send-button")).to_be_visible()
    turn = wait_turn(conversation_id, site)
    assert turn.status == "stopped"

    page.reload()
    alice_tab.wait_connected()
    expect(page.locator("#send-button")).to_be_visible()
    assert_timeline_complete(alice_tab, conversation_id)


def test_stop_at_the_continue_prompt_logs_no_error(servers, visit, alice, llm):
    maker = Agent("maker", ["tasks.create"], [("tasks.create", {"title": t}) for t in ("one", "two", "three")])
    llm.respond = Plan([maker], answer="Created three tasks.")
    site = servers(limits={"turn_max_skill_calls": 2})
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page

    alice_tab.send("Create three tasks")
    expect(page.locator("#stop-button")).to_be_visible()
    with page.expect_response(lambda r: r.url.endswith("/stop/")) as stopped:
        page.click("#stop-button")
    assert stopped.value.status == 204
    expect(page.locator("#pause-prompt .pause")).to_have_count(0)
    assert wait_turn(conversation_id, site).status == "stopped"

    page.reload()
    alice_tab.wait_connected()
    assert_timeline_complete(alice_tab, conversation_id)
    assert alice_tab.console_errors == [] and alice_tab.failed_requests == []


def test_a_stop_pressed_as_the_turn_ends_says_so_without_an_error(servers, visit, alice):
    """The turn ended, and the push that says so has not reached the page yet (here:
    it never does, the status changed under it): the Stop is answered with a notice,
    not a 409 (a console error) into a composer about to be replaced."""
    alice_tab = visit(servers(workers=0), "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page
    turn = turn_for(Conversation.objects.get(pk=conversation_id), status=TurnStatus.RUNNING)
    page.reload()
    alice_tab.wait_connected()
    expect(page.locator("#stop-turn-button")).to_be_visible()
    type(turn).objects.filter(pk=turn.pk).update(status=TurnStatus.COMPLETED)  # no event: no push
    with page.expect_response(lambda r: r.url.endswith("/stop/")) as stopped:
        page.click("#stop-turn-button")
    assert stopped.value.status == 200
    expect(page.locator("#page-notice")).to_have_text("The turn had already been answered before the Stop reached it.")


def test_a_draft_pushed_after_its_placeholder_went_is_dropped_without_an_error(servers, visit, alice):
    """A push computed while the turn ran reaches the page after a reply (a Stop, a
    Continue) replaced the panel that held the answer draft: the stale draft is dropped,
    not logged as htmx:oobErrorNoTarget (it failed CI once, after a Stop). The `visit`
    fixture checks the console."""
    from orchestration.lifecycle.turns import turn_draft_save

    alice_tab = visit(servers(workers=0), "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page
    turn = turn_for(Conversation.objects.get(pk=conversation_id), status=TurnStatus.RUNNING, lease_token="t")
    page.reload()
    alice_tab.wait_connected()
    expect(page.locator("#answer-draft")).to_be_visible()
    page.evaluate("() => { window.pushes = 0; document.addEventListener('htmx:wsAfterMessage', () => window.pushes++);"
                  " document.getElementById('answer-draft').remove(); }")  # as the reply's panel did
    turn_draft_save(turn=turn, token="t", text="Half of the answer")
    page.wait_for_function("() => window.pushes > 0")
    expect(page.locator("#answer-draft")).to_have_count(0)
