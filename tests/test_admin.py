"""A staff auditor can follow one turn end to end in the admin; nobody edits it, superusers
included."""

import re
from datetime import UTC, datetime
from decimal import Decimal
from unittest import mock

import pytest
from django.contrib import admin
from django.urls import reverse

from orchestration.admin import AuditAdmin, json_fields
from orchestration.models import AgentProfile, Event, LLMCall, Message, SkillExecution, TurnPause
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


@pytest.fixture
def full_trail(trail):
    """One row of every audit model."""
    turn = trail["turn"]
    trail["message"] = Message.objects.create(
        conversation=trail["conversation"], turn=turn, seq=1, role="assistant",
        tool_calls=[{"id": "call_dispatch_1", "type": "function", "function": {
            "name": "dispatch_agent", "arguments": '{"agent_id": "search", "mission": "<b>Find</b> overdue tasks"}'}}],
    )
    trail["llm_call"] = LLMCall.objects.create(turn=turn, key="orchestrator:0", model="gpt-4o-mini",
                                               response={"content": "", "tool_calls": []})
    trail["pause"] = TurnPause.objects.create(turn=turn, limit="turn_max_agents", detail={"completed": ["search"]})
    return trail


AUDIT_RECORDS = ["conversation", "turn", "parent", "outer", "event", "message", "llm_call", "pause"]


@pytest.mark.parametrize("key", AUDIT_RECORDS)
def test_a_superuser_reads_but_cannot_change_or_delete(client, superuser, full_trail, key):
    record = full_trail[key]
    client.force_login(superuser)
    page = client.get(change_url(record))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert client.post(change_url(record), {}).status_code == 403
    delete = reverse(f"admin:{record._meta.app_label}_{record._meta.model_name}_delete", args=[record.pk])
    assert client.get(delete).status_code == 403
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert type(record).objects.filter(pk=record.pk).exists()


@pytest.mark.parametrize("key", AUDIT_RECORDS)
def test_a_superuser_cannot_add_or_bulk_delete(client, superuser, full_trail, key):
    record = full_trail[key]
    name = f"admin:{record._meta.app_label}_{record._meta.model_name}"
    client.force_login(superuser)
    assert client.get(reverse(f"{name}_add")).status_code == 403
    changelist = client.get(reverse(f"{name}_changelist"))
    assert changelist.status_code == 200
    assert "delete_selected" not in changelist.content.decode()
    client.post(reverse(f"{name}_changelist"), {"action": "delete_selected", "_selected_action": [record.pk], "post": "yes"})
    assert type(record).objects.filter(pk=record.pk).exists()


def test_agent_profiles_stay_editable(client, superuser):
    profile = AgentProfile.objects.create(name="checker", system_prompt="Look things up.")
    client.force_login(superuser)
    assert 'name="_save"' in client.get(change_url(profile)).content.decode()
    assert client.get(reverse("admin:orchestration_agentprofile_add")).status_code == 200


def test_every_json_column_of_the_audit_is_shown_indented():
    """A JSON column added later must get its `<field>_json` display, or it disappears."""
    for model, model_admin in admin.site._registry.items():
        if isinstance(model_admin, AuditAdmin):
            shown = model_admin.get_readonly_fields(None)
            assert [f for f in json_fields(model) if f"{f}_json" not in shown] == [], model.__name__


def test_event_times_show_milliseconds(client, staff, trail):
    at = datetime(2026, 11, 24, 14, 0, 0, 123456, tzinfo=UTC)
    with mock.patch("django.utils.timezone.now", return_value=at):
        event = Event.objects.create(conversation=trail["conversation"], turn=trail["turn"],
                                     type="turn.started", summary="Turn 1 started")
    client.force_login(staff)
    listed = client.get(reverse("admin:orchestration_event_changelist")).content.decode()
    assert "2026-11-24 14:00:00.123 UTC" in listed
    assert "2026-11-24 14:00:00.123 UTC" in client.get(change_url(event)).content.decode()


def test_payloads_are_indented_and_escaped(client, staff, trail):
    event = Event.objects.create(
        conversation=trail["conversation"], type="agent.subagent_created", summary="x",
        payload={"mission": "<script>alert(1)</script>", "skills": ["tasks.search"]},
    )
    client.force_login(staff)
    page = client.get(change_url(event)).content.decode()
    assert "<script>alert(1)</script>" not in page
    # PostgreSQL's jsonb keeps keys in its own order (shorter first): compare line by line
    block = page.split('<pre class="audit-json">', 1)[1].split("</pre>", 1)[0]
    assert sorted(block.splitlines()) == sorted([
        "{", '  &quot;mission&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;,', "  &quot;skills&quot;: [",
        "    &quot;tasks.search&quot;", "  ]", "}"]) or sorted(block.splitlines()) == sorted([
        "{", '  &quot;mission&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;', "  &quot;skills&quot;: [",
        "    &quot;tasks.search&quot;", "  ],", "}"])


def test_the_turn_shows_the_orchestrators_tool_calls(client, staff, full_trail):
    client.force_login(staff)
    page = client.get(change_url(full_trail["turn"])).content.decode()
    assert "The orchestrator&#x27;s tool calls" in page
    assert "<strong>dispatch_agent</strong>" in page and "call_dispatch_1" in page
    # the arguments parsed from the model's JSON text, indented, the model's markup escaped
    assert "{\n  &quot;agent_id&quot;: &quot;search&quot;,\n  &quot;mission&quot;: &quot;&lt;b&gt;Find" in page
    assert "<b>Find</b>" not in page


def event_ids(page: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'/admin/orchestration/event/(\d+)/change/', page)}


def test_events_filter_by_turn_and_dispatch(client, staff, trail):
    other_turn = turn_for(trail["conversation"], status="completed")
    other = Event.objects.create(conversation=trail["conversation"], turn=other_turn, type="turn.started", summary="2")
    client.force_login(staff)
    events = reverse("admin:orchestration_event_changelist")
    by_turn = client.get(events, {"turn__id__exact": trail["turn"].pk}).content.decode()
    assert event_ids(by_turn) == {trail["event"].pk}
    assert event_ids(client.get(events, {"turn__id__exact": other_turn.pk}).content.decode()) == {other.pk}
    by_dispatch = client.get(events, {"dispatch__id__exact": trail["parent"].pk}).content.decode()
    assert event_ids(by_dispatch) == {trail["event"].pk}
    assert event_ids(client.get(events, {"dispatch__id__exact": trail["child"].pk}).content.decode()) == set()
    assert event_ids(client.get(events, {"turn__id__exact": "x"}).content.decode()) == set()


@pytest.mark.parametrize(
    "model, query",
    [
        ("llmcall", "turn__id__exact"),
        ("llmcall", "dispatch__id__exact"),
        ("skillexecution", "dispatch__id__exact"),
        ("skillexecution", "dispatch__turn__id"),
        ("message", "turn__id__exact"),
        ("agentdispatch", "turn__id__exact"),
        ("turnpause", "turn__id__exact"),
    ],
)
def test_the_trail_filters_by_turn_and_dispatch(client, staff, full_trail, model, query):
    value = full_trail["parent"].pk if query.startswith("dispatch__id") else full_trail["turn"].pk
    client.force_login(staff)
    page = client.get(reverse(f"admin:orchestration_{model}_changelist"), {query: value})
    assert page.status_code == 200  # a lookup the admin does not allow redirects to ?e=1


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


def test_a_call_without_a_price_says_so_on_its_page_and_in_the_list(client, staff, trail):
    call = LLMCall.objects.create(turn=trail["turn"], key="orchestrator:1", model="local-model", response={},
                                  prompt_tokens=10, completion_tokens=5, cost_usd=None)
    client.force_login(staff)
    for url in (change_url(call), reverse("admin:orchestration_llmcall_changelist")):
        page = client.get(url).content.decode()
        assert "no price" in page and ">None<" not in page
