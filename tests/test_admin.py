"""A staff auditor can follow one turn end to end in the admin; only superusers edit."""

from decimal import Decimal

import pytest
from django.urls import reverse

from orchestration.models import Event, LLMCall, SkillExecution
from tests.factories import conversation_for, dispatch_for, turn_for


@pytest.fixture
def trail(alice):
    conversation = conversation_for(alice, title="Quarterly review")
    turn = turn_for(conversation)
    parent = dispatch_for(turn, "search", mission="Find overdue tasks")
    child = dispatch_for(turn, "search-sub", parent=parent, depth=2, mission="Look deeper")
    outer = SkillExecution.objects.create(
        dispatch=parent, skill="tasks.search", tool_call_id="call_outer", arguments={"overdue": True}
    )
    inner = SkillExecution.objects.create(
        dispatch=parent, skill="memory.search", tool_call_id="call_inner", parent=outer
    )
    event = Event.objects.create(
        conversation=conversation, turn=turn, dispatch=parent,
        type="agent.subagent_created", summary="search created",
    )
    return {"conversation": conversation, "turn": turn, "parent": parent, "child": child,
            "outer": outer, "inner": inner, "event": event}


def change_url(obj):
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


@pytest.mark.parametrize("key", ["conversation", "turn", "parent", "outer", "event"])
def test_staff_can_read_every_step(client, staff, trail, key):
    client.force_login(staff)
    page = client.get(change_url(trail[key]))
    assert page.status_code == 200


def test_turn_page_lists_its_dispatches(client, staff, trail):
    client.force_login(staff)
    page = client.get(change_url(trail["turn"])).content.decode()
    assert "search-sub" in page and "search" in page
    assert "1 events" in page


def test_nested_execution_shows_under_its_parent(client, staff, trail):
    client.force_login(staff)
    page = client.get(change_url(trail["outer"])).content.decode()
    assert "nested skill executions" in page.lower()
    assert "memory.search" in page


def test_nested_dispatch_shows_under_its_parent(client, staff, trail):
    client.force_login(staff)
    page = client.get(change_url(trail["parent"])).content.decode()
    assert "nested dispatches" in page.lower()
    assert "search-sub" in page


@pytest.mark.parametrize(
    "model, query",
    [
        ("turn", "status__exact=running"),
        ("agentdispatch", "state__exact=created"),
        ("skillexecution", "status__exact=running"),
        ("event", "type=agent.subagent_created"),
        ("conversation", "q=Quarterly"),
        ("event", "conversation__owner__id__exact=1"),
    ],
)
def test_changelists_filter_and_search(client, staff, trail, model, query):
    client.force_login(staff)
    page = client.get(reverse(f"admin:orchestration_{model}_changelist") + "?" + query)
    assert page.status_code == 200


def test_staff_cannot_edit_the_trail(client, staff, trail):
    client.force_login(staff)
    response = client.post(change_url(trail["turn"]), {"status": "failed"})
    assert response.status_code == 403
    trail["turn"].refresh_from_db()
    assert trail["turn"].status == "running"


def test_superuser_can_edit_turns_but_not_events(client, superuser, trail):
    client.force_login(superuser)
    page = client.get(change_url(trail["turn"])).content.decode()
    assert 'name="_save"' in page
    page = client.get(change_url(trail["event"])).content.decode()
    assert 'name="_save"' not in page


def test_non_staff_cannot_open_admin(client, alice, trail):
    client.force_login(alice)
    response = client.get(change_url(trail["turn"]))
    assert response.status_code == 302


def test_staff_read_each_calls_cost_and_a_dispatchs_with_its_nested_ones(client, staff, trail):
    turn, parent, child = trail["turn"], trail["parent"], trail["child"]
    LLMCall.objects.create(turn=turn, key="orchestrator:1", model="gpt-4o-mini", prompt_tokens=900,
                           completion_tokens=100, cost_usd=Decimal("0.000195"))
    LLMCall.objects.create(turn=turn, dispatch=parent, key="search:0", model="gpt-4o-mini", prompt_tokens=400,
                           completion_tokens=50, cost_usd=Decimal("0.00009"))
    LLMCall.objects.create(turn=turn, dispatch=child, key="search-sub:0", model="llama3", prompt_tokens=300,
                           completion_tokens=20, cost_usd=None)
    client.force_login(staff)
    calls = client.get(reverse("admin:orchestration_llmcall_changelist")).content.decode()
    assert "$0.0002" in calls and "&lt;$0.0001" in calls and "no price" in calls
    page = client.get(change_url(parent)).content.decode()
    assert ("450 tokens · &lt;$0.0001; with the agents it delegated to: 770 tokens · at least &lt;$0.0001 "
            "(cost unknown: 1 call of llama3 has no price)") in page
    page = client.get(change_url(turn)).content.decode()
    assert "1770 tokens · at least $0.0003 (cost unknown: 1 call of llama3 has no price)" in page
