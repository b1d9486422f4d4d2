"""Sub-agents' live progress (issue 15): each model call of an agent is a step in the
timeline, and the graph shows a running agent's step and what it is doing."""

from __future__ import annotations

import pytest

from assistant.live import panel_context
from django.template.loader import render_to_string
from orchestration.models import Event
from orchestration.records.events import event_record
from tests.factories import conversation_for, dispatch_for, turn_for
from tests.support.llm_server import Agent, Plan

SEARCH = ("tasks.search", {"status": "open"})


def graph_html(conversation) -> str:
    """The graph panel; the same whether it reads the agents' progress itself or takes
    it from the waterfall's events (a push that renders both reads them once)."""
    def graph(panels: frozenset[str]) -> str:
        context = {**panel_context(conversation, panels), "panels": frozenset({"graph"})}
        return " ".join(render_to_string("conversations/panels.html", context).split())

    alone = graph(frozenset({"graph"}))
    assert graph(frozenset({"graph", "waterfall"})) == alone
    return alone


@pytest.mark.django_db
def test_the_graph_shows_a_running_agents_step_and_skill(alice):
    conversation = conversation_for(alice)
    turn = turn_for(conversation)
    agent = dispatch_for(turn, "finder", state="running")

    assert "step 1: asking the model" in graph_html(conversation)
    event_record(type="agent.llm_call", dispatch=agent, summary="finder step 1", payload={"step": 1})
    event_record(type="skill.started", dispatch=agent, summary="finder → tasks.search",
                 payload={"skill": "tasks.search", "arguments": {}})
    assert "step 1: running <code>tasks.search</code>" in graph_html(conversation)
    event_record(type="skill.finished", dispatch=agent, summary="finder ← tasks.search: ok",
                 payload={"skill": "tasks.search", "status": "completed", "ok": True})
    assert "step 2: asking the model; last <code>tasks.search</code> completed" in graph_html(conversation)


@pytest.mark.django_db(transaction=True)
def test_each_agent_step_is_in_the_timeline_and_the_graph_sums_it_up(llm, run_turn):
    llm.respond = Plan([Agent("finder", ["tasks.search"], [SEARCH, SEARCH])], answer="Done.", discover=False)
    turn = run_turn()
    assert turn.status == "completed", turn.error

    steps = Event.objects.filter(turn=turn, type="agent.llm_call").order_by("id")
    assert [e.payload["step"] for e in steps] == [1, 2, 3]
    assert [e.payload["tool_calls"] for e in steps] == [["tasks.search"], ["tasks.search"], []]
    assert steps[0].summary == "finder step 1: tasks.search" and steps[2].summary == "finder step 3: report (stop)"
    assert all(e.dispatch.agent_id == "finder" and e.payload["usage"]["prompt_tokens"] == 100 for e in steps)
    assert "3 steps; last <code>tasks.search</code> completed" in graph_html(turn.conversation)
