"""An MCP call in doubt, in chromium, live against daphne and a qcluster: the worker
calling the test MCP server (its stdio child) is SIGKILLed after the ticket was created
and before the answer was stored. The page asks, without a reload, what was sent and
when; "Go on as if it failed" lets the turn finish, and the ticket exists once."""

from __future__ import annotations

import os
import signal

import pytest
from playwright.sync_api import expect

from orchestration.models import SkillApproval
from tests.browser.conftest import assert_timeline_complete, wait_turn
from tests.live.conftest import wait_for
from tests.support.llm_server import Agent, Plan
from tests.support.mcp_fixtures import lines, stdio_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TICKET = ("mcp.tools.create_ticket", {"title": "Printer jam on floor 3"})


def test_a_lost_mcp_call_asks_on_the_page_and_the_owner_goes_on(servers, visit, alice, llm, request, tmp_path):
    stdio_server(write_policy="allow")
    (tmp_path / "hold-once").touch()  # the server creates the ticket, then never answers
    llm.respond = Plan([Agent("clerk", ["mcp.tools.create_ticket"], [TICKET], report="Filed.")],
                       answer="I could not confirm the ticket.")
    site = servers(env={"MCP_TEST_DIR": str(tmp_path), "ASSISTANT_MCP_CONFIG_SECONDS": "0"})
    tab = visit(site, "alice")
    conversation_id = tab.new_conversation()
    page = tab.page
    page.evaluate("window.__sameDocument = true")

    tab.send("File a ticket about the printer jam")
    wait_for(lambda: lines(tmp_path / "tickets.jsonl"), timeout=60, what="the ticket", cluster=site.cluster)
    (received,) = lines(tmp_path / "received.jsonl")
    os.kill(received["parent"], signal.SIGKILL)  # the worker that sent it

    prompt = page.locator(".pause.approval.in-doubt")
    expect(prompt).to_contain_text("Sent, but no answer. clerk's call of mcp.tools.create_ticket may or may not "
                                   "have happened.", timeout=60_000)
    expect(prompt.locator(".approval-call")).to_contain_text("Printer jam on floor 3")
    expect(prompt.locator(".approval-reasons")).to_contain_text("nobody knows whether it happened")
    expect(page.locator("#approve-button")).to_have_text("Send it again")
    expect(page.locator("#always-button")).to_have_count(0)
    tab.screenshot(request.node, "in-doubt", ".pause.approval")

    with page.expect_response(lambda r: r.url.endswith("/approval/")) as answered:
        page.click("#deny-button")
    assert answered.value.status == 204

    expect(page.locator("#messages .notice", has_text="in doubt")).to_contain_text(
        "alice chose to go on as if it failed.")
    expect(page.locator("#messages")).to_contain_text("Whether mcp.tools.create_ticket happened is not known")
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert len(lines(tmp_path / "tickets.jsonl")) == 1 and len(lines(tmp_path / "received.jsonl")) == 1
    assert SkillApproval.objects.get(turn=turn).decision == "denied"
    assert_timeline_complete(tab, conversation_id)
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
