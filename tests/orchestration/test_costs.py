"""Costs a user can read (issue 15), end to end: the real engine and the real openai SDK
against the scripted server, a lead agent that delegates to a helper, priced models.
Each call's cost lands on its LLMCall; the lead's total includes its helper's; the turn is
the orchestrator plus every agent; the conversation is every turn; and the graph, the
counters, the audit view, the JSON export, `manage.py audit` and the admin say so. An
offline turn (no price) shows no cost at all."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from orchestration.budgets.usage import conversation_spend, turn_spend
from orchestration.models import AgentDispatch, AgentProfile, LLMCall
from orchestration.lifecycle.turns import turn_start
from tests.support.llm_server import Reply, agent_of, calls, text

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {
    "gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.60},
    "gpt-4.1-mini": {"input": 0.40, "cached_input": 0.10, "output": 1.60},
}
# Per call, as (prompt, completion, cached) tokens, and so in millionths of a dollar:
ORCHESTRATOR_USAGE = (1000, 50, 200)  # gpt-4o-mini-2024-07-18: 800 × 0.15 + 200 × 0.075 + 50 × 0.60 = 165
LEAD_USAGE = (2000, 100, 1000)  # gpt-4.1-mini: 1000 × 0.40 + 1000 × 0.10 + 100 × 1.60 = 660
HELPER_USAGE = (500, 40, 0)  # gpt-4.1-mini: 500 × 0.40 + 40 × 1.60 = 264
MICRO = Decimal("0.000001")


def dispatch(agent_id: str, skills: list[str], prefix: str, **extra) -> Reply:
    return calls(("dispatch_agent", {"agent_id": agent_id, "mission": f"mission:{agent_id}", "skills": skills,
                                     **extra}), prefix=prefix)


def report(request: dict) -> Reply:
    """What the last tool said: a lead's or the orchestrator's report of its agents."""
    return text("Saw: " + [m for m in request["messages"] if m["role"] == "tool"][-1]["content"])


def with_usage(step, usage):
    """A scripted step (a Reply or a function of the request) that reports `usage`."""
    def respond(request):
        reply = step(request) if callable(step) else step
        reply.usage = usage
        return reply
    return respond


def last_user_text(request: dict) -> str:
    return [m for m in request["messages"] if m["role"] == "user"][-1]["content"] or ""


@pytest.fixture
def priced(settings, llm):
    settings.ASSISTANT_MODEL_PRICES = PRICES
    settings.ASSISTANT_ORCHESTRATOR_MODEL = "gpt-4o-mini-2024-07-18"  # a dated snapshot: gpt-4o-mini's price
    settings.ASSISTANT_AGENT_MODEL = "gpt-4.1-mini"
    llm.ids = "scripted"
    AgentProfile.objects.create(name="lead", description="Splits work among helpers.",
                                system_prompt="You lead a small team.", may_delegate=True, max_tool_calls=5)
    orchestrator = [dispatch("lead", ["tasks.create", "tasks.search"], "o1", profile="lead"),
                    calls(("get_agent_results", {}), prefix="o2"), report]
    agents = {
        "lead": [dispatch("helper", ["tasks.create"], "l1"), calls(("get_agent_results", {}), prefix="l2"), report],
        "helper": [calls(("use_skill", {"skill": "tasks.create", "arguments": {"title": "from helper"}}), prefix="h1"),
                   text("helper made a task")],
    }
    usage = {"lead": LEAD_USAGE, "helper": HELPER_USAGE}

    def respond(request: dict) -> Reply:
        done = sum(1 for m in request["messages"] if m["role"] == "assistant")
        if "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}:
            steps = agents[agent_of(request)]
            return with_usage(steps[min(done, len(steps) - 1)], usage[agent_of(request)])(request)
        if last_user_text(request) == "And thanks":  # the second turn: a plain answer
            return with_usage(Reply(content="You are welcome."), ORCHESTRATOR_USAGE)(request)
        return with_usage(orchestrator[min(done, len(orchestrator) - 1)], ORCHESTRATOR_USAGE)(request)

    llm.respond = respond
    return llm


def test_a_nested_agents_cost_rolls_up_to_its_parent_the_turn_and_the_conversation(priced, run_turn):
    turn = run_turn("Make a task through a helper")
    assert turn.status == "completed", turn.error
    lead, helper = AgentDispatch.objects.get(agent_id="lead"), AgentDispatch.objects.get(agent_id="helper")
    assert helper.parent == lead
    calls = {name: LLMCall.objects.filter(turn=turn, dispatch=d) for name, d in
             {"orchestrator": None, "lead": lead, "helper": helper}.items()}
    assert {name: qs.count() for name, qs in calls.items()} == {"orchestrator": 3, "lead": 3, "helper": 2}
    # each call is priced as it is stored, by its model (the snapshot by its base model)
    assert set(calls["orchestrator"].values_list("model", "cost_usd")) == {("gpt-4o-mini-2024-07-18", 165 * MICRO)}
    assert set(calls["lead"].values_list("cost_usd", flat=True)) == {660 * MICRO}
    assert set(calls["helper"].values_list("cost_usd", flat=True)) == {264 * MICRO}

    spend = turn_spend(turn)
    assert spend.agent(lead.pk).cost_usd == 3 * 660 * MICRO
    assert spend.agent_total(lead.pk).cost_usd == (3 * 660 + 2 * 264) * MICRO  # the lead pays for its helper
    assert spend.agent_total(lead.pk).total_tokens == 3 * 2100 + 2 * 540
    assert spend.agent_total(helper.pk).cost_usd == 2 * 264 * MICRO
    assert spend.orchestrator.cost_usd == 3 * 165 * MICRO
    assert spend.total.cost_usd == spend.orchestrator.cost_usd + spend.agent_total(lead.pk).cost_usd
    assert spend.total.cost_usd == 3003 * MICRO and spend.total.unpriced == ()
    # the tokens agree with the engine's own counters
    turn.refresh_from_db()
    assert (spend.total.prompt_tokens, spend.total.completion_tokens, spend.total.cached_tokens) == (
        turn.prompt_tokens, turn.completion_tokens, turn.cached_tokens)

    second = turn_start(conversation=turn.conversation, text="And thanks")
    second.refresh_from_db()
    assert second.status == "completed", second.error
    assert turn_spend(second).total.cost_usd == 165 * MICRO
    assert conversation_spend(turn.conversation).cost_usd == (3003 + 165) * MICRO


def graph_row(page: str, dispatch) -> str:
    return re.search(rf'<li class="node[^"]*" id="node-{dispatch.pk}">(.*?)</li>', page, re.S).group(1)


def test_the_graph_counters_audit_export_and_admin_show_the_costs(priced, run_turn, client, superuser):
    turn = run_turn("Make a task through a helper")
    conversation = turn.conversation
    lead, helper = AgentDispatch.objects.get(agent_id="lead"), AgentDispatch.objects.get(agent_id="helper")
    client.force_login(conversation.owner)

    page = client.get(conversation.get_absolute_url()).content.decode()
    assert "with its agents: 7380 tokens · $0.0025" in graph_row(page, lead)
    assert "1080 tokens · $0.0005" in graph_row(page, helper)
    assert '<span id="turn-spend">10530 tokens · $0.0030</span>' in page
    assert '<span id="conversation-cost">$0.0030</span>' in page

    audit = client.get(reverse("conversation_audit", args=[conversation.pk])).content.decode()
    assert "In all: 8 model calls · 10530 tokens · $0.0030" in audit
    assert "$0.0030</span> (the orchestrator: 3150 tokens · $0.0005)" in audit
    assert "with its agents: 7380 tokens · $0.0025" in audit

    export = json.loads(client.get(reverse("conversation_export", args=[conversation.pk])).content)
    assert export["usage"]["cost_usd"] == "0.0030030000"
    [turn_json] = export["turns"]
    assert turn_json["usage"]["cost_usd"] == "0.0030030000" and turn_json["usage"]["llm_calls"] == 8
    assert turn_json["orchestrator_usage"]["cost_usd"] == "0.0004950000"
    [lead_json] = turn_json["dispatches"]
    assert lead_json["usage"]["cost_usd"] == "0.0019800000"
    assert lead_json["usage_with_children"]["cost_usd"] == "0.0025080000"
    assert lead_json["children"][0]["usage_with_children"]["cost_usd"] == "0.0005280000"
    out = StringIO()
    call_command("audit", str(conversation.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["usage"] == export["usage"]

    client.force_login(superuser)
    admin_turn = client.get(reverse("admin:orchestration_turn_change", args=[turn.pk])).content.decode()
    assert "10530 tokens · $0.0030 (the orchestrator: 3150 tokens · $0.0005)" in admin_turn
    admin_lead = client.get(reverse("admin:orchestration_agentdispatch_change", args=[lead.pk])).content.decode()
    assert "6300 tokens · $0.0020; with the agents it delegated to: 7380 tokens · $0.0025" in admin_lead
    calls = client.get(reverse("admin:orchestration_llmcall_changelist")).content.decode()
    assert calls.count("$0.0002") == 3 and calls.count("$0.0007") == 3 and calls.count("$0.0003") == 2


def test_an_offline_turn_shows_no_cost_at_all(run_turn, client, superuser):
    turn = run_turn("find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm")
    assert turn.status == "completed", turn.error
    assert set(LLMCall.objects.values_list("model", "cost_usd")) == {("offline-planner", None)}
    spend = turn_spend(turn)
    assert spend.total.cost is None and spend.total.unpriced_calls == spend.total.llm_calls > 3
    conversation = turn.conversation
    client.force_login(conversation.owner)
    for url in (conversation.get_absolute_url(), reverse("conversation_audit", args=[conversation.pk])):
        page = client.get(url).content.decode()
        assert "tokens" in page
        assert "$" not in page and "cost unknown" not in page
    export = json.loads(client.get(reverse("conversation_export", args=[conversation.pk])).content)
    assert export["usage"]["cost_usd"] is None
    assert export["usage"]["unpriced_calls"] == [{"model": "offline-planner", "calls": spend.total.llm_calls}]
    assert all(d["usage_with_children"]["cost_usd"] is None for d in export["turns"][0]["dispatches"])
    client.force_login(superuser)
    admin_turn = client.get(reverse("admin:orchestration_turn_change", args=[turn.pk])).content.decode()
    assert "$" not in admin_turn
    assert "no price" in client.get(reverse("admin:orchestration_llmcall_changelist")).content.decode()
