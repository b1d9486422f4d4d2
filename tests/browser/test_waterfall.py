"""The waterfall in chromium, on the real stack: a diamond a → (b, c) → d where c is slow
and b calls a skill it was not granted (refused, so red); live while it runs, then in the
audit view, matched against the stored events; and on a phone without page overflow."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from orchestration.models import Event
from orchestration.reports.waterfall import turn_waterfall
from tests.browser.conftest import wait_turn
from tests.support.llm_server import Agent, Plan, agent_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DIAMOND = [
    Agent("a", ["tasks.search"], [("tasks.search", {"status": "open"})], report="Two open tasks."),
    Agent("b", ["tasks.search"], [("tasks.create", {"title": "not allowed"})], depends_on=["a"],
          report="Could not create the task."),
    Agent("c", ["tasks.search"], [("tasks.search", {"status": "done"})], depends_on=["a"], report="One done."),
    Agent("d", ["memory.save"], [("memory.save", {"text": "Reviewed", "tags": ["review"]})], depends_on=["b", "c"],
          report="Saved."),
]
SLOW_SECONDS = 1.5


def with_slow_c(plan: Plan):
    """c's every model call answers late: the slow branch, and so the critical path."""

    def respond(request):
        reply = plan(request)
        if any(t["function"]["name"] == "use_skill" for t in request.get("tools", [])) and agent_of(request) == "c":
            reply.delay = SLOW_SECONDS
        return reply

    return respond


def row(page, agent_id: str, scope: str):
    return page.locator(f'{scope} .wf-row[data-agent="{agent_id}"]')


def bars(page, agent_id: str, scope: str) -> list[dict]:
    return row(page, agent_id, scope).locator("rect.wf-bar").evaluate_all(
        "rects => rects.map(r => ({left: +r.dataset.left, width: +r.dataset.width, kind: r.dataset.kind,"
        " failed: r.classList.contains('wf-bar-failed')}))")


def test_the_waterfall_of_a_diamond_live_and_in_the_audit(servers, visit, alice, llm, request):
    llm.respond = with_slow_c(Plan(DIAMOND, answer="Done: one task could not be created."))
    # The live waterfall is re-rendered at most every 3 panel intervals (3 s by default):
    # about as long as c runs, so a push may miss c running. Paced faster here, one cannot.
    site = servers(env={"ASSISTANT_PANEL_INTERVAL_SECONDS": "0.2"})
    tab = visit(site, "alice")
    conversation_id = tab.new_conversation()
    page = tab.page
    tab.send("Review my tasks")

    # live: c's row appears and runs while the socket pushes the panel
    live = "#live-waterfall"
    expect(row(page, "c", live).locator(".state")).to_have_text("running")
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    expect(row(page, "d", live).locator(".state")).to_have_text("completed")
    expect(page.locator(f"{live} .wf-critical-path")).to_have_text("critical path: a → c → d")

    # the audit view, against the stored events
    tab.goto(f"/conversations/{conversation_id}/audit/")
    scope = f"#waterfall-{turn.pk}"
    expect(page.locator(f"{scope} .wf-row:not(.wf-axis)")).to_have_count(5)
    expect(page.locator(f"{scope} .wf-critical-path")).to_have_text("critical path: a → c → d")
    expect(page.locator(f"{scope} .wf-failures")).to_have_text("1 failure")
    expect(row(page, "b", scope).locator(".wf-count")).to_have_text("1 failed")
    failed = row(page, "b", scope).locator("rect.wf-bar-failed")
    expect(failed).to_have_count(1)
    assert failed.evaluate("r => getComputedStyle(r).fill") == "rgb(192, 57, 43)"  # --bad

    expected = {r.label: r for r in turn_waterfall(turn).rows}
    for agent_id in ("a", "b", "c", "d"):
        shown = bars(page, agent_id, scope)
        stored = expected[agent_id].bars
        assert [(b["kind"], b["left"], b["width"]) for b in shown] == [(b.kind, b.left, b.width) for b in stored]
    a, c, d = (bars(page, x, scope) for x in ("a", "c", "d"))
    assert a[-1]["left"] + a[-1]["width"] <= c[0]["left"], "c starts after a"
    assert c[-1]["left"] + c[-1]["width"] <= d[0]["left"], "d starts after c"
    span_s = (turn_waterfall(turn).end - turn_waterfall(turn).start).total_seconds()
    slow = [b for b in c if b["kind"] == "model"]
    assert all(b["width"] >= SLOW_SECONDS / span_s * 100 * 0.9 for b in slow), (slow, span_s)
    # d's arrows: one per dependency, each down from where that agent's span ends (c's, b's
    # rows above) and along to d's start, with an arrowhead
    arrows = row(page, "d", scope).locator("g.wf-dep")
    expect(arrows).to_have_count(2)
    geometry = arrows.evaluate_all("gs => gs.map(g => { const [down, along] = g.querySelectorAll('line');"
                                   " const a = down.getBoundingClientRect(), b = along.getBoundingClientRect();"
                                   " return {x: a.left, to: b.right, marker: along.getAttribute('marker-end')}; })")
    d_start = row(page, "d", scope).locator("rect.wf-span").bounding_box()["x"]
    for agent_id, arrow in zip(("b", "c"), sorted(geometry, key=lambda g: g["x"])):
        span = row(page, agent_id, scope).locator("rect.wf-span").bounding_box()
        assert abs(arrow["x"] - (span["x"] + span["width"])) <= 2, (agent_id, arrow, span)
        assert abs(arrow["to"] - d_start) <= 2 and arrow["marker"].startswith("url(#wf-arrow-")
    refused_event = Event.objects.filter(turn=turn, type="skill.finished", payload__ok=False).get()
    assert refused_event.dispatch.agent_id == "b"

    # a click on the red bar shows its request and result
    failed.click()
    detail = page.locator(".wf-call:target")
    expect(detail).to_be_visible()
    expect(detail).to_contain_text("tasks.create")
    expect(detail).to_contain_text("not allowed")  # the request's arguments
    expect(detail.locator("pre.error")).to_contain_text("failed")
    shot = tab.screenshot(request.node, "waterfall", scope)
    if os.environ.get("DOCS_SCREENSHOTS"):  # the README's picture, refreshed on request only
        shutil.copy(shot, Path(settings.BASE_DIR) / "docs" / "waterfall.png")

    # a phone: no page scrolls sideways, the waterfall's or any other (the timeline's rows
    # expanded, a call's details open, an empty conversation's suggestions, a 404)
    phone = visit(site, "alice")
    phone.page.set_viewport_size({"width": 390, "height": 844})

    def fits(what):
        width = phone.page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], (what, width)

    phone.goto(f"/conversations/{conversation_id}/audit/")
    expect(phone.page.locator(scope)).to_be_visible()
    phone.page.locator(f"{scope} rect.wf-bar-failed").click()
    fits("audit, a call's details open")
    phone.goto(f"/conversations/{conversation_id}/")
    expect(phone.page.locator(f"{live} .wf-row[data-agent='c']")).to_be_visible()
    assert re.search(r"\d", phone.page.locator(f"{live} .wf-summary").inner_text())
    for summary in phone.page.locator("#timeline details > summary").all():
        summary.click()
    fits("conversation, every timeline row expanded")
    phone.goto("/")
    fits("the conversation list")
    phone.new_conversation()
    expect(phone.page.locator("#suggestions")).to_be_visible()
    fits("an empty conversation")
    phone.expect_failure(r"^404 GET .*/no/such/page/$")
    phone.expect_failure("the server responded with a status of 404")
    assert phone.goto("/no/such/page/").status == 404
    fits("a 404")
