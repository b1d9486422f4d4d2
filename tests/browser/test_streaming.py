"""The orchestrator's answer streams into the chat (issue 15), in chromium against daphne
and a qcluster, from a scripted model that streams its chunks as providers do."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import wait_turn
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ANSWER = " ".join(f"Paragraph word {i}." for i in range(60))  # ~1,000 characters, ~250 chunks
FIND = Agent("finder", ["tasks.search"], [("tasks.search", {"status": "open"})], report="No open tasks.")
SEED = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"
SEED_AGENTS = [  # planned from the catalogue: no get_skill
    Agent("overdue", ["tasks.search"], [("tasks.search", {"status": "open", "overdue": True})],
          report="No overdue tasks."),
    Agent("mailer", ["email.send"], [("email.send", {"to": ["bob@example.com"], "subject": "Overdue tasks",
                                                     "body": "None overdue."})],
          depends_on=["overdue"], report="Mailed Bob."),
    Agent("meeting", ["calendar.create_event"], [("calendar.create_event", {
        "title": "Review meeting", "start": "2026-11-25T14:00:00", "end": "2026-11-25T15:00:00"})],
          report="Booked."),
]

DRAFT_STATE = """() => ({
  draft: (document.querySelector('#answer-draft .message.streaming .content') || {}).textContent || '',
  completed: !!document.querySelector('#timeline .type-turncompleted'),
  answers: document.querySelectorAll('#messages > article.message.assistant').length,
})"""


def drafts_until_answered(page, timeout: float = 60) -> list[dict]:
    """What the chat showed, looked at every 50 ms until the stored answer is there."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page.evaluate(DRAFT_STATE)
        if not seen or state != seen[-1]:
            seen.append(state)
        if state["answers"]:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no answer after {timeout}s; saw {seen[-3:]}")


def test_the_seed_example_takes_three_calls_and_its_answer_grows_before_the_turn_completes(
        servers, visit, alice, llm, request):
    llm.respond = Plan(SEED_AGENTS, answer=ANSWER, discover=False)
    llm.chunk_interval = 0.02  # about 5 s of streaming
    site = servers()
    tab = visit(site, "alice")
    conversation_id = tab.new_conversation()
    page = tab.page
    page.evaluate("window.__sameDocument = true")

    tab.send(SEED)
    seen = drafts_until_answered(page)

    growing = [state["draft"].strip() for state in seen if state["draft"] and not state["completed"]]
    assert len(set(growing)) >= 3, seen  # it grew, step by step, while the turn ran
    assert all(ANSWER.startswith(text) for text in growing)
    assert sorted(growing, key=len) == growing
    assert len(growing[0]) < len(ANSWER) / 2
    expect(page.locator("#messages > article.message.assistant .content")).to_have_text(ANSWER)
    expect(page.locator("#answer-draft")).to_have_count(0)
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert turn.llm_iterations == 3 and not turn.pauses.exists()  # dispatch, results, answer
    assert set(turn.dispatches.values_list("outcome", flat=True)) == {"completed"}
    assert turn.answer_draft == ""
    assert page.evaluate("window.__sameDocument") is True
    tab.screenshot(request.node, "answered", ".chat")
    assert tab.dialogs == [] and tab.outside_requests() == [] and llm.errors == []


def test_a_reload_mid_stream_shows_what_has_arrived_and_goes_on(servers, visit, alice, llm, request):
    llm.respond = Plan([FIND], answer=ANSWER, discover=False)
    llm.chunk_interval = 0.03  # about 8 s of streaming
    site = servers()
    tab = visit(site, "alice")
    conversation_id = tab.new_conversation()
    page = tab.page

    tab.send("Find my open tasks")
    page.wait_for_function("() => (document.querySelector('#answer-draft .content') || {textContent: ''})"
                           ".textContent.length > 100")
    page.reload()
    shown = page.locator("#answer-draft .message.streaming .content").text_content().strip()
    assert len(shown) > 100 and ANSWER.startswith(shown)  # in the page as served, before any push
    tab.screenshot(request.node, "mid-stream", ".chat")
    tab.wait_connected()
    page.wait_for_function("n => (document.querySelector('#answer-draft .content') || {textContent: ''})"
                           ".textContent.trim().length > n", arg=len(shown))  # and it goes on growing

    expect(page.locator("#messages > article.message.assistant .content")).to_have_text(ANSWER, timeout=30_000)
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert llm.errors == []
