"""Oversized and absurdly nested tool arguments from the model, end to end.

Each must come back to the model as an error it can read and correct — recorded where a
skill was named, never executed — and must not fail the agent or the turn. Before the
RecursionError fix, a few thousand nested brackets failed the sub-agent outright and
dead-lettered the orchestrator's turn after three attempts.

The real openai SDK talks to the scripted server; tasks run inline.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.core import mail

from orchestration.models import AgentDispatch, SkillExecution
from skills.domains.email.models import OutboxEmail
from tests.support.llm_server import Agent, Plan, Reply

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def scripted_ids(llm):
    """These tests look answers up by the tool-call ids they scripted; the engine's
    handling of providers' fresh and reused ids is tested in test_engine.py."""
    llm.ids = "scripted"


def raw_use_skill(plan: Plan, agent_id: str, raw: str):
    """`plan`, except that `agent_id`'s first response is one use_skill call sent as `raw`."""

    def respond(request: dict) -> Reply:
        first = not any(m["role"] == "tool" for m in request["messages"])
        mission = any(f"mission:{agent_id}" in (m.get("content") or "") for m in request["messages"])
        if mission and first:
            return Reply(tool_calls=[("hostile", "use_skill", raw)])
        return plan(request)

    return respond


def told(llm, call_id: str) -> dict:
    """What the model was told in answer to its call `call_id`."""
    for request in llm.requests:
        for message in request["messages"]:
            if message.get("tool_call_id") == call_id:
                return json.loads(message["content"])
    raise AssertionError(f"no answer to {call_id} reached the model")


def assert_agent_carried_on(turn, agent_id: str) -> None:
    assert turn.status == "completed", turn.error
    assert AgentDispatch.objects.get(turn=turn, agent_id=agent_id).outcome == "completed"


def test_an_oversized_payload_for_a_granted_skill_is_refused_unsent(llm, run_turn):
    limit = settings.SKILLS_MAX_ARGUMENT_BYTES
    send = {"to": ["bob@example.com"], "subject": "Everything", "body": "y" * (limit + 10)}
    plan = Plan([Agent("mailer", ["email.send"], [("email.send", send)])])
    llm.respond = plan
    turn = run_turn()

    row = SkillExecution.objects.get(skill="email.send")
    assert (row.status, row.result["error_kind"]) == ("failed", "invalid_arguments")
    [problem] = row.result["problems"]
    assert problem.endswith(f"bytes of JSON; the limit is {limit}")
    assert set(row.arguments) == {"oversized_bytes", "preview"}  # not the whole payload
    answer = told(llm, "mailer_c0")
    assert answer["kind"] == "invalid_arguments" and answer["problems"] == [problem]
    assert not OutboxEmail.objects.exists() and mail.outbox == []
    assert_agent_carried_on(turn, "mailer")


def test_arguments_nested_past_the_cap_are_refused_unsent(llm, run_turn):
    body = "y"
    for _ in range(200):
        body = [body]
    raw = json.dumps({"skill": "email.send",
                      "arguments": {"to": ["bob@example.com"], "subject": "Hi", "body": body}})
    llm.respond = raw_use_skill(Plan([Agent("mailer", ["email.send"])]), "mailer", raw)
    turn = run_turn()

    row = SkillExecution.objects.get(skill="email.send")
    assert row.result["problems"] == ["arguments nest more than 32 levels deep"]
    assert told(llm, "hostile")["problems"] == ["arguments nest more than 32 levels deep"]
    assert not OutboxEmail.objects.exists() and mail.outbox == []
    assert_agent_carried_on(turn, "mailer")


def test_arguments_nested_too_deep_to_parse_are_answered_not_fatal(llm, run_turn):
    depth = 50_000
    raw = '{"skill": "memory.search", "arguments": {"query": ' + "[" * depth + "]" * depth + "}}"
    llm.respond = raw_use_skill(Plan([Agent("reader", ["memory.search"])]), "reader", raw)
    turn = run_turn()

    assert "nest too deeply to be read" in told(llm, "hostile")["error"]
    assert not SkillExecution.objects.exists()  # no skill could even be named
    assert_agent_carried_on(turn, "reader")


def test_the_orchestrator_answers_unparseable_nesting_instead_of_dead_lettering(llm, run_turn):
    depth = 20_000  # 40 000 characters: under the orchestrator's length cap
    raw = '{"domain": ' + "[" * depth + "]" * depth + "}"

    def respond(request: dict) -> Reply:
        if not any(m["role"] == "tool" for m in request["messages"]):
            return Reply(tool_calls=[("hostile", "get_skill", raw)])
        return Reply(content="Sorry, I could not look that up.")

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert "nest too deeply to be read" in told(llm, "hostile")["error"]
    assert llm.errors == []
