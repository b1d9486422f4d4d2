"""Tokens and costs rolled up (orchestration/budgets/usage.py), from the stored model calls:
per agent (a delegating agent pays for its helpers), per turn, per conversation; the
counters count a running agent's calls as they are made, and once."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import F
from django.utils import timezone

from orchestration.budgets.usage import Spend, conversation_spend, turn_and_conversation_spend, turn_spend
from orchestration.models import AgentDispatch, LLMCall, Turn
from orchestration.reports.selectors import conversation_usage
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db


def call(turn, key, *, dispatch=None, model="gpt-4o-mini", prompt=100, completion=10, cached=0, cost="0.0001"):
    return LLMCall.objects.create(
        turn=turn, dispatch=dispatch, key=key, model=model, prompt_tokens=prompt, completion_tokens=completion,
        cached_tokens=cached, cost_usd=None if cost is None else Decimal(cost))


@pytest.fixture
def nested(alice):
    """Turn 1: the orchestrator, a lead with a helper who has a helper, and a sibling."""
    conversation = conversation_for(alice)
    turn = turn_for(conversation, status="completed")
    lead = dispatch_for(turn, "lead")
    helper = dispatch_for(turn, "helper", parent=lead, depth=2)
    deep = dispatch_for(turn, "deep", parent=helper, depth=3)
    sibling = dispatch_for(turn, "sibling")
    call(turn, "orchestrator:1", cost="0.001")
    call(turn, "orchestrator:2", cost="0.002")
    call(turn, "lead:1", dispatch=lead, cost="0.01")
    call(turn, "helper:1", dispatch=helper, cost="0.1", cached=40)
    call(turn, "helper:2", dispatch=helper, cost="0.2")
    call(turn, "deep:1", dispatch=deep, cost="1")
    call(turn, "sibling:1", dispatch=sibling, cost="3")
    return {"conversation": conversation, "turn": turn, "lead": lead, "helper": helper, "deep": deep,
            "sibling": sibling}


def test_a_delegating_agent_includes_all_its_descendants(nested, django_assert_max_num_queries):
    with django_assert_max_num_queries(2):
        spend = turn_spend(nested["turn"])
    lead, helper, deep, sibling = (nested[k].pk for k in ("lead", "helper", "deep", "sibling"))
    assert spend.agent(lead).cost_usd == Decimal("0.01")
    assert spend.agent_total(lead).cost_usd == Decimal("1.31")
    assert spend.agent_total(helper).cost_usd == Decimal("1.3")
    assert spend.agent_total(helper).llm_calls == 3 and spend.agent_total(helper).cached_tokens == 40
    assert spend.agent_total(deep) == spend.agent(deep)
    assert spend.agent_total(sibling).cost_usd == Decimal("3")


def test_a_turn_is_its_orchestrator_and_all_its_agents(nested):
    spend = turn_spend(nested["turn"])
    assert spend.orchestrator.cost_usd == Decimal("0.003") and spend.orchestrator.llm_calls == 2
    assert spend.total.cost_usd == Decimal("4.313")
    assert spend.total.llm_calls == 7 and spend.total.total_tokens == 7 * 110


def test_a_conversation_is_all_its_turns(nested):
    turn2 = turn_for(nested["conversation"])
    call(turn2, "orchestrator:1", cost="0.5", prompt=1000)
    with_two = conversation_spend(nested["conversation"])
    assert with_two.cost_usd == Decimal("4.813")
    assert with_two.prompt_tokens == 7 * 100 + 1000
    assert with_two.cost_text() == "$4.81"


def test_the_turns_and_the_conversations_spend_come_from_one_query(nested, django_assert_num_queries):
    """The live page's counters and agent graph: the same figures as read apart, the
    conversation's other turns (priced or not) counted in its total only."""
    earlier, turn = nested["turn"], turn_for(nested["conversation"])
    call(earlier, "orchestrator:3", model="llama3", cost=None)
    lead = dispatch_for(turn, "lead")
    call(turn, "orchestrator:1", cost="0.5", prompt=1000)
    call(turn, "lead:1", dispatch=lead, cost="0.25")
    call(turn, "helper:1", dispatch=dispatch_for(turn, "helper", parent=lead, depth=2), model="llama3", cost=None)
    dispatches = list(turn.dispatches.all())

    with django_assert_num_queries(1):
        spend, conversation = turn_and_conversation_spend(turn, dispatches)

    assert spend == turn_spend(turn) and spend.agent_total(lead.pk).llm_calls == 2
    assert conversation == conversation_spend(nested["conversation"])
    assert conversation.unpriced == (("llama3", 2),) and conversation.llm_calls == 7 + 1 + 3


def test_calls_without_a_price_are_named_not_guessed(nested):
    call(nested["turn"], "orchestrator:3", model="llama3", cost=None)
    call(nested["turn"], "helper:3", dispatch=nested["helper"], model="llama3", cost=None)
    call(nested["turn"], "lead:2", dispatch=nested["lead"], model="mystery", cost=None)
    spend = turn_spend(nested["turn"])
    assert spend.total.cost_usd == Decimal("4.313")  # the priced calls, a lower bound
    assert spend.total.unpriced == (("llama3", 2), ("mystery", 1))
    assert spend.total.cost_text() == (
        "at least $4.31 (cost unknown: 2 calls of llama3, 1 call of mystery have no price)")
    assert spend.agent_total(nested["lead"].pk).unpriced == (("llama3", 1), ("mystery", 1))
    assert spend.agent(nested["deep"].pk).cost_text() == "$1.00"


def test_an_offline_turn_has_no_cost_at_all(alice):
    turn = turn_for(conversation_for(alice))
    for i in range(3):
        call(turn, f"orchestrator:{i}", model="offline-planner", cost=None)
    spend = turn_spend(turn).total
    assert spend.cost is None and spend.cost_text() == ""
    assert spend.summary() == "330 tokens"
    assert spend.unpriced_note() == "cost unknown: 3 calls of offline-planner have no price"
    assert spend.to_json()["cost_usd"] is None
    assert spend.to_json()["unpriced_calls"] == [{"model": "offline-planner", "calls": 3}]


def test_a_free_model_costs_zero_dollars():
    spend = Spend(llm_calls=1, prompt_tokens=10, cost_usd=Decimal(0))
    assert spend.cost == 0 and spend.cost_text() == "$0.00"


def test_the_json_form_is_exact_and_reads_back(nested):
    spend = turn_spend(nested["turn"]).total
    assert spend.to_json()["cost_usd"] == "4.3130000000"
    assert Spend.from_json(spend.to_json()) == spend


def test_no_calls_no_spend(alice):
    turn = turn_for(conversation_for(alice))
    dispatch_for(turn, "idle")
    spend = turn_spend(turn)
    assert spend.total == Spend() and spend.total.cost is None
    assert conversation_spend(turn.conversation) == Spend()


def test_running_agents_count_before_they_end_and_once_after(alice):
    conversation = conversation_for(alice)
    turn = turn_for(conversation, prompt_tokens=50, completion_tokens=5)
    call(turn, "orchestrator:1", prompt=50, completion=5)
    running = dispatch_for(turn, "a1", state="running")
    call(turn, "a1:0", dispatch=running, prompt=100, completion=10, cached=4)

    assert conversation_usage(conversation=conversation).total_tokens == 50 + 5 + 100 + 10
    assert conversation_usage(conversation=conversation).cached_tokens == 4

    # It ends: its usage moves to the turn's counters with finished_at; its calls stay the calls.
    AgentDispatch.objects.filter(pk=running.pk).update(state="waiting_for_merge", finished_at=timezone.now(),
                                                       prompt_tokens=100, completion_tokens=10, cached_tokens=4)
    Turn.objects.filter(pk=turn.pk).update(prompt_tokens=F("prompt_tokens") + 100,
                                           completion_tokens=F("completion_tokens") + 10,
                                           cached_tokens=F("cached_tokens") + 4)
    assert conversation_usage(conversation=conversation).total_tokens == 50 + 5 + 100 + 10
