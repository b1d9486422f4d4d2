"""The conversation page on a phone (390×844) and on a desktop (1280×900), in chromium,
against real daphne and qcluster (issue 28, items 2, 6 and 12):

- the approval card fits the phone: the whole email, long lines and unbroken words
  included, is inside the viewport, and the page never scrolls sideways;
- the top bar's links keep apart, and a long title takes at most two lines while its
  whole text stays in its `title` attribute;
- while a turn runs, its newest timeline event is in the first viewport (the "now
  running" strip near the chat, kept live by static/js/live.js), and on a phone it stays
  in view when the user scrolls down the chat to the composer.

The `visit` fixture fails a test on any console error or failed request.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from orchestration.models import Conversation
from skills.domains.email.models import OutboxEmail
from tests.browser.conftest import assert_timeline_complete, wait_turn
from tests.browser.test_dashboard import slowed
from tests.conftest import APPROVALS_ON_ENV, make_user
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}

# Long lines, a long unbroken word (a link) and blank lines: all of it must be readable.
BODY = ("Hi Erin,\n\n"
        "The quarterly planning meeting moves to Thursday afternoon at three, in the large room on the fourth "
        "floor, because the budget review needs the whole finance team and they are away on Tuesday.\n\n"
        "The agenda is at https://intranet.example.com/planning/2026/q4/agenda-final-version-with-budget-notes.pdf "
        "and the hiring plan follows it.\n\n"
        "Alice")
ERIN = ("email.send", {"to": ["erin@example.com"], "subject": "The quarterly planning meeting moves to Thursday",
                       "body": BODY})
# The answer, with a long link and a code block wider than a phone: neither widens the page.
ANSWER = ("I emailed Erin the agenda link, "
          "https://intranet.example.com/planning/2026/q4/agenda-final-version-with-budget-notes.pdf\n\n"
          "```\nmeeting: quarterly planning | moved from: Tuesday 10:00 | moved to: Thursday 15:00 | room: 4.12\n```")
LONG_TITLE = ("Email erin@example.com that the quarterly planning meeting moves to Thursday afternoon, "
              "with the agenda, the budget review, the hiring plan and the launch checklist attached")

OVERFLOW = "() => ({scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth})"
# The boxes of the top bar's items (brand, links, user name, log out), in page coordinates.
TOPBAR_BOXES = """() => Array.from(document.querySelectorAll(
        '.topbar .brand, .topbar nav > a, .topbar nav > span, .topbar nav button'))
    .map(el => { const r = el.getBoundingClientRect();
                 return {text: el.textContent.trim(), left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })"""
LINES = "el => el.getBoundingClientRect().height / parseFloat(getComputedStyle(el).lineHeight)"


def phone(visitor):
    visitor.page.set_viewport_size(PHONE)
    return visitor


def assert_no_sideways_scroll(page) -> None:
    widths = page.evaluate(OVERFLOW)
    assert widths["scroll"] <= widths["client"], f"the page scrolls sideways: {widths}"


def assert_within_width(page, selector: str) -> None:
    box = page.locator(selector).bounding_box()
    width = page.viewport_size["width"]
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= width, f"{selector} is cut: {box} in {width} px"
    # nor is any of it hidden inside the element (a clipped or scrolling <pre>)
    inner = page.eval_on_selector(selector, "el => [el.scrollWidth, el.clientWidth]")
    assert inner[0] <= inner[1], f"{selector} hides part of its text: {inner}"


def assert_topbar_items_apart(page) -> None:
    boxes = page.evaluate(TOPBAR_BOXES)
    assert [b["text"] for b in boxes][:2] == ["Assistant", "Approvals"], boxes
    width = page.viewport_size["width"]
    for box in boxes:
        assert box["left"] >= 0 and box["right"] <= width, f"{box['text']} is cut: {box}"
    for i, one in enumerate(boxes):
        for other in boxes[i + 1:]:
            same_line = one["top"] < other["bottom"] and other["top"] < one["bottom"]
            if same_line:
                gap = max(other["left"] - one["right"], one["left"] - other["right"])
                assert gap >= 6, f"{one['text']!r} and {other['text']!r} touch ({gap:.1f} px apart)"


def assert_title_clamped(page, title: str) -> None:
    heading = page.locator("#conversation-title")
    expect(heading).to_have_text(title)  # the whole text is in the page…
    expect(heading).to_have_attribute("title", title)  # …and shown on hovering it
    lines = heading.evaluate(LINES)
    assert lines <= 2.05, f"the title takes {lines:.1f} lines"


def test_the_approval_card_fits_a_phone(servers, visit, llm, request, approvals_on):
    # the top bar at its fullest: Approvals, Admin, a long name, Log out
    make_user("alexandra.lindqvist", is_staff=True)
    llm.respond = Plan([Agent("mailer", ["email.send"], [ERIN], report="Mailed Erin.")], answer=ANSWER)
    site = servers(env=APPROVALS_ON_ENV)
    tab = phone(visit(site, "alexandra.lindqvist", is_mobile=True, has_touch=True))
    conversation_id = tab.new_conversation()
    page = tab.page
    assert_no_sideways_scroll(page)
    assert_topbar_items_apart(page)

    # a title at its longest (200 characters, as one typed it): two lines at most
    title = (LONG_TITLE + " " + LONG_TITLE)[:200]
    Conversation.objects.filter(pk=conversation_id).update(title=title)
    page.reload()
    tab.wait_connected()
    tab.send(LONG_TITLE)

    card = page.locator(".pause.approval")
    expect(card.locator(".approval-call pre")).to_have_text(BODY)
    expect(card.locator(".approval-call")).to_contain_text("erin@example.com")
    tab.screenshot(request.node, "phone-approval")
    for selector in (".pause.approval", ".pause.approval .approval-call", ".pause.approval .approval-call pre",
                     "#approve-button", "#always-button", "#deny-button", "#stop-button"):
        assert_within_width(page, selector)
    assert_no_sideways_scroll(page)
    assert_topbar_items_apart(page)
    assert_title_clamped(page, title)
    # a tap shows the title whole
    page.click("#conversation-title")
    assert page.locator("#conversation-title").evaluate(LINES) > 2.05

    with page.expect_response(lambda r: r.url.endswith("/approval/")) as answered:
        page.click("#approve-button")
    assert answered.value.status == 204
    expect(page.locator("#messages .message.assistant", has_text="I emailed Erin the agenda")).to_be_visible()
    expect(page.locator("#messages .message.assistant pre")).to_contain_text("moved to: Thursday 15:00")
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert OutboxEmail.objects.get().body == BODY
    assert_no_sideways_scroll(page)
    # the pushes that replaced the heading since kept it whole, as the tap asked
    expect(page.locator("#conversation-title")).to_have_attribute("title", title)
    assert page.locator("#conversation-title").evaluate(LINES) > 2.05


def newest_summary(page) -> str:
    return page.eval_on_selector("#timeline > [id^='event-']:last-child summary",
                                 "el => el.textContent.replace(/\\s+/g, ' ').trim()")


STRIP_SHOWS_NEWEST = """(before = null) => {
    const rows = document.querySelectorAll("#timeline > [id^='event-']");
    const strip = document.getElementById("now-running-text");
    if (!rows.length || !strip) return false;
    const norm = s => s.replace(/\\s+/g, " ").trim();
    const shown = norm(strip.textContent);
    return shown === norm(rows[rows.length - 1].querySelector("summary").textContent) && shown !== before;
}"""


def assert_in_first_viewport(page, selector: str) -> None:
    box = page.locator(selector).bounding_box()
    height, width = page.viewport_size["height"], page.viewport_size["width"]
    assert box and box["y"] >= 0 and box["y"] + box["height"] <= height, f"{selector} is out of view: {box}"
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"{selector} is cut: {box}"


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_newest_event_is_in_view_while_a_turn_runs(servers, visit, alice, llm, request, viewport):
    searcher = Agent("searcher", ["tasks.search"], [("tasks.search", {"status": "open"})] * 3, report="No open tasks.")
    llm.respond = Plan([searcher], answer="You have no open tasks.")
    site = servers()
    tab = visit(site, "alice")
    tab.page.set_viewport_size(viewport)
    conversation_id = tab.new_conversation()
    page = tab.page
    strip = page.locator("#now-running")
    expect(strip).to_be_hidden()  # nothing runs

    # a conversation with history: on a phone the chat alone is taller than the screen
    for question in ("Find my open tasks, then tell me which are overdue and which can wait until next week",
                     "And once more, please, with the ones due this month listed first"):
        tab.send(question)
        wait_turn(conversation_id, site)
        expect(page.locator("#send-button")).to_be_visible()
    expect(strip).to_be_hidden()

    llm.respond = slowed(Plan([searcher], answer="You have no open tasks."), 1.5)
    tab.send("Search my tasks slowly, three times")
    expect(page.locator("#composer-note")).to_be_visible()
    expect(strip).to_be_visible()
    page.wait_for_function(STRIP_SHOWS_NEWEST)
    first = newest_summary(page)
    page.evaluate("window.scrollTo(0, 0)")
    assert_in_first_viewport(page, "#now-running")
    tab.screenshot(request.node, "running")

    # it follows the run: a later event replaces it, pushed live
    page.wait_for_function(STRIP_SHOWS_NEWEST, arg=first)
    assert_in_first_viewport(page, "#now-running")
    if viewport == PHONE:
        # scrolled down to where the answer streams in, the strip is still in view
        page.locator("#composer").scroll_into_view_if_needed()
        assert page.evaluate("window.scrollY") > 0
        box = strip.bounding_box()
        assert box and 0 <= box["y"] and box["y"] + box["height"] <= viewport["height"], box
        tab.screenshot(request.node, "running-scrolled")
        assert_no_sideways_scroll(page)
    # its link leads to the whole timeline
    strip.get_by_role("link").click()
    expect(page.locator("#timeline > [id^='event-']").last).to_be_in_viewport()

    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    expect(page.locator("#messages .message.assistant", has_text="You have no open tasks.").last).to_be_visible()
    expect(strip).to_be_hidden()  # nothing runs any more
    assert_timeline_complete(tab, conversation_id)
