"""A Stop at every phase of a turn (issue 28): before the model answers, while an agent's
model call is out, during the streamed answer. Whatever was in flight, the page's totals
end equal to the audit's (an answer that arrives after the Stop is paid for: the audit
counts it, and so does the page), the chat keeps what had streamed, and no console error
or failed request appears (the `visit` fixture checks that after the test)."""

from __future__ import annotations

import re
import time

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from orchestration.budgets.usage import conversation_spend
from orchestration.models import Conversation, LLMCall
from tests.browser.conftest import wait_turn
from tests.browser.test_dashboard import node
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FINDER = Agent("finder", ["tasks.search"], [("tasks.search", {"status": "open"})] * 2, report="No open tasks.")
ANSWER = " ".join(f"Sentence number {i} of a long answer." for i in range(80))


def is_agent(request: dict) -> bool:
    return any(tool["function"]["name"] == "use_skill" for tool in request.get("tools", []))


def late(plan: Plan, *, first_orchestrator_call: float = 0.0, agent_calls: float = 0.0):
    """The plan, with the orchestrator's first answer or every agent answer late."""
    asked = []

    def respond(request):
        reply = plan(request)
        if is_agent(request):
            reply.delay = agent_calls
        elif not asked:
            asked.append(request)
            reply.delay = first_orchestrator_call
        return reply

    return respond


def settled(llm, turn, timeout: float = 30.0) -> None:
    """Until nothing is out with the model and the stored calls stop changing: an answer
    that was in flight at the Stop is stored (an agent's) or dropped (the orchestrator's)."""
    deadline, last, quiet_since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        now = (llm.in_flight, LLMCall.objects.filter(turn=turn).count())
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif now[0] == 0 and time.monotonic() - quiet_since > 1.5:
            return
        time.sleep(0.1)
    raise AssertionError(f"the turn's model calls did not settle: {last}")


def asked(llm, timeout: float = 20.0) -> None:
    """Until a model call is out (the late answer a Stop then meets)."""
    deadline = time.monotonic() + timeout
    while not llm.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert llm.in_flight == 1


def totals_agree(tab, site, conversation_id: int) -> int:
    """The page's counters (live, no reload) show the audit's tokens; the audit page too."""
    spend = conversation_spend(Conversation.objects.get(pk=conversation_id))
    counters = tab.page.locator("#counters")
    if spend.total_tokens:
        expect(counters).to_contain_text(re.compile(rf"\b{spend.total_tokens} tokens? \({spend.prompt_tokens} in"))
    else:
        expect(counters).not_to_contain_text("token")
    audit = tab.page.context.new_page()
    audit.goto(site.url + reverse("conversation_audit", args=[conversation_id]))
    if spend.llm_calls:
        expect(audit.locator("#audit-conversation-usage")).to_contain_text(f"{spend.total_tokens} tokens")
    audit.close()
    return spend.llm_calls


def start(servers, visit, llm, respond, text="Find my open tasks"):
    llm.respond = respond
    site = servers()
    tab = visit(site, "alice")
    conversation_id = tab.new_conversation()
    tab.send(text)
    return site, tab, conversation_id


def stop(tab) -> None:
    with tab.page.expect_response(lambda r: r.url.endswith("/stop/")) as stopped:
        tab.page.click("#stop-turn-button")
    assert stopped.value.status == 204


def test_a_stop_before_the_model_answers(servers, visit, alice, llm):
    site, tab, conversation_id = start(servers, visit, llm, late(Plan([FINDER]), first_orchestrator_call=3.0))
    expect(tab.page.locator("#stop-turn-button")).to_be_visible()
    asked(llm)  # a worker took the turn
    stop(tab)
    turn = wait_turn(conversation_id, site)
    assert turn.status == "stopped"
    settled(llm, turn)
    assert totals_agree(tab, site, conversation_id) == 0  # the plan that came late was not stored
    expect(tab.page.locator("#messages")).to_contain_text("Stopped at your request. No agent had completed.")


def test_a_stop_while_an_agents_model_call_is_out(servers, visit, alice, llm):
    site, tab, conversation_id = start(servers, visit, llm, late(Plan([FINDER]), agent_calls=2.5))
    expect(node(tab.page, "finder").locator(".state")).to_have_text("running")
    asked(llm)  # the agent's call is out
    stop(tab)
    turn = wait_turn(conversation_id, site)
    assert turn.status == "stopped"
    settled(llm, turn)
    # the agent's answer came after the Stop: in the audit, in the timeline, in the page's totals
    assert LLMCall.objects.filter(turn=turn, dispatch__agent_id="finder").exists()
    expect(tab.page.locator("#timeline")).to_contain_text("finder step 1: answered too late to act on")
    assert totals_agree(tab, site, conversation_id) >= 2


def test_a_stop_during_the_streamed_answer_keeps_what_had_streamed(servers, visit, alice, llm):
    llm.chunk_interval = 0.03  # the answer streams for several seconds
    site, tab, conversation_id = start(servers, visit, llm, Plan([FINDER], answer=ANSWER))
    draft = tab.page.locator("#answer-draft .content")
    expect(draft).to_contain_text("Sentence number 3 ")
    stop(tab)
    turn = wait_turn(conversation_id, site)
    assert turn.status == "stopped"
    settled(llm, turn)
    notice = tab.page.locator("#messages .message.notice .content", has_text="Stopped at your request")
    expect(notice).to_contain_text("Completed: finder.")
    expect(notice).to_contain_text("The answer so far:")
    expect(notice).to_contain_text("Sentence number 0 of a long answer. Sentence number 1")
    expect(tab.page.locator("#answer-draft")).to_have_count(0)
    totals_agree(tab, site, conversation_id)
