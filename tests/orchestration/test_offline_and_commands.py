"""The embedded default end to end: the offline planner through `manage.py ask`."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core import mail
from django.core.management import CommandError, call_command
from django_q.conf import Conf

from orchestration.llm.offline import OfflineProvider, plan_agents
from orchestration.models import AgentDispatch, Conversation, Turn
from skills.domains.calendar.models import CalendarEvent
from skills.domains.email.models import OutboxEmail

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"


@pytest.fixture(autouse=True)
def restore_sync(monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", Conf.SYNC)  # `ask --sync` flips it for the process


def ask(*args) -> str:
    out = StringIO()
    call_command("ask", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_offline_plan_has_a_search_and_two_dependents():
    plan = {spec["agent_id"]: spec for spec in plan_agents(EXAMPLE)}
    assert set(plan) == {"find-tasks", "send-email", "book-meeting"}
    assert plan["send-email"]["depends_on"] == plan["book-meeting"]["depends_on"] == ["find-tasks"]
    assert plan["find-tasks"]["skills"] == ["tasks.search"]


def test_offline_provider_is_deterministic():
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": EXAMPLE}]
    tools = [{"type": "function", "function": {"name": "get_skill"}}]
    first = OfflineProvider().complete(model="m", messages=messages, tools=tools)
    second = OfflineProvider().complete(model="m", messages=messages, tools=tools)
    # It plans from the catalogue in its prompt: no discovery call first.
    assert first == second and {call.name for call in first.tool_calls} == {"dispatch_agent"}


def test_offline_provider_stops_at_max_tokens_as_a_provider_does():
    """Under a spend cap the engine bounds each answer (issue 24); offline too."""
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": EXAMPLE}]
    tools = [{"type": "function", "function": {"name": "get_skill"}}]
    whole = OfflineProvider().complete(model="m", messages=messages, tools=tools, max_tokens=10_000)
    assert whole == OfflineProvider().complete(model="m", messages=messages, tools=tools)
    cut = OfflineProvider().complete(model="m", messages=messages, tools=tools, max_tokens=20)
    assert (cut.finish_reason, cut.tool_calls, cut.usage.completion_tokens) == ("length", [], 20)
    assert cut.usage.prompt_tokens == whole.usage.prompt_tokens and whole.usage.completion_tokens > 20


def test_ask_answers_the_example_with_real_side_effects(alice):
    output = ask("--user", "alice", "--sync", EXAMPLE)
    assert "Offline planner" in output
    assert "completed" in output
    email = OutboxEmail.objects.get(owner=alice)
    assert email.to == ["bob@example.com"]
    assert len(mail.outbox) == 1
    event = CalendarEvent.objects.get(owner=alice, title="Review meeting")
    assert event.start.hour == 14
    assert AgentDispatch.objects.filter(outcome="completed").count() == 3
    assert Turn.objects.get().llm_iterations == 3  # dispatch, results, answer


def test_ask_json_prints_the_audit_tree(alice):
    data = json.loads(ask("--user", "alice", "--sync", "--json", EXAMPLE))
    assert data["status"] == "completed"
    agents = {d["agent_id"]: d for d in data["dispatches"]}
    assert agents["send-email"]["depends_on"] == ["find-tasks"]
    assert agents["send-email"]["skill_executions"][0]["skill"] == "email.send"
    assert agents["find-tasks"]["started_at"] and agents["find-tasks"]["usage"]["llm_calls"] == 2


def test_ask_trips_a_limit_and_resumes_with_continue(alice, settings):
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_skill_calls": 1}
    output = ask("--user", "alice", "--sync", EXAMPLE)
    assert "Paused — continue?" in output
    assert "--continue" in output
    conversation = Conversation.objects.get(owner=alice)
    resumes = 0
    while "Paused" in output and resumes < 5:  # each Continue grants one more skill call
        output = ask("--user", "alice", "--sync", "--conversation", str(conversation.pk), "--continue")
        resumes += 1
    assert "Offline planner" in output
    assert resumes == 2  # three skill calls, one per budget
    assert OutboxEmail.objects.filter(owner=alice).count() == 1
    assert CalendarEvent.objects.filter(owner=alice, title="Review meeting").count() == 1


def test_ask_refuses_unknown_user(db):
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        ask("--user", "nobody", "hi")


def test_ask_cannot_continue_another_users_conversation(alice, bob):
    conversation = Conversation.objects.create(owner=alice)
    with pytest.raises(CommandError, match="has no conversation"):
        ask("--user", "bob", "--conversation", str(conversation.pk), "--continue")


def test_audit_command_exports_json(alice):
    ask("--user", "alice", "--sync", EXAMPLE)
    conversation = Conversation.objects.get(owner=alice)
    out = StringIO()
    call_command("audit", str(conversation.pk), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["owner"] == "alice" and len(data["turns"]) == 1
    assert data["turns"][0]["events"][0]["type"] == "turn.started"
