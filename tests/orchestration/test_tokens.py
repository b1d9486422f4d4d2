"""Token economy figures (issue 15, benchmarks/tokens.py): the seed example run through
the engine against the scripted server, every request measured. Only structure is
asserted (the sizes move with any prompt edit); the aims are checked by the benchmark."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from benchmarks import tokens
from benchmarks.__main__ import main as bench_main
from benchmarks.tokens import ORCHESTRATOR, SUB_AGENT
from skills.models import CalendarEvent, OutboxEmail
from tests.checks import assert_ended_turns_closed

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def figures(transactional_db, alice):
    yield tokens.seed_example_figures(user=alice)
    assert_ended_turns_closed()


def test_the_seed_example_is_measured_call_by_call(figures):
    assert figures.turn_status == "completed"
    roles = [(c.role, c.agent) for c in figures.calls]
    assert roles.count((ORCHESTRATOR, "")) == 3 and figures.turn["orchestrator_calls"] == 3
    assert sorted(agent for role, agent in roles if role == SUB_AGENT) == [
        "book-review", "book-review", "email-bob", "email-bob", "find-overdue", "find-overdue"]
    for call in figures.calls:
        assert call.prompt_tokens > 0 and call.completion_tokens > 0 and call.prompt_bytes >= call.prompt_chars
        assert sum(call.parts.values()) >= call.prompt_tokens * 0.9  # the parts account for the request
        assert {"tools", "system", "user"} <= call.parts.keys()
    assert figures.turn["tokens"] == sum(c.prompt_tokens + c.completion_tokens for c in figures.calls)
    # The scripted server reported these counts as usage: the engine's roll-up agrees.
    assert (figures.turn["engine_prompt_tokens"], figures.turn["engine_completion_tokens"]) == (
        figures.turn["prompt_tokens"], figures.turn["completion_tokens"])
    assert {role: (r["calls"], r["aim"]) for role, r in figures.roles.items()} == {
        ORCHESTRATOR: (3, 4000), SUB_AGENT: (6, 1500)}


def test_the_orchestrator_prompt_only_grows_at_its_end(figures):
    static = figures.static_prefix[ORCHESTRATOR]
    assert static == {"system_identical": True, "tools_identical": True}
    first, *later = [c for c in figures.calls if c.role == ORCHESTRATOR]
    assert first.prefix_of_previous == 0 and not first.starts_with_previous
    previous = first
    for call in later:
        assert call.starts_with_previous
        assert call.prefix_of_previous == pytest.approx(previous.prompt_bytes / call.prompt_bytes, abs=0.001)
        assert call.best_prefix == call.prefix_of_previous
        previous = call
    assert figures.orchestrator_prompt["of which the catalogue"] > 0


def test_a_sub_agent_keeps_its_prefix_and_only_the_grant_differs_between_agents(figures):
    static = figures.static_prefix[SUB_AGENT]
    assert static["system_identical"] and static["tools_identical_within_each_agent"]
    assert static["tools_differ_at"] == [
        "tools[0].function.description", "tools[0].function.parameters.properties.skill.enum"]
    by_agent: dict[str, list] = {}
    for call in figures.calls:
        if call.role == SUB_AGENT:
            by_agent.setdefault(call.agent, []).append(call)
    for first, second in by_agent.values():
        assert second.best_prefix == pytest.approx(first.prompt_bytes / second.prompt_bytes, abs=0.001)


def test_the_agents_did_the_work_on_the_seeded_data(figures, alice):
    (email,) = OutboxEmail.objects.filter(owner=alice)
    assert email.to == ["bob@example.com"] and "Renew passport" in email.body
    (meeting,) = CalendarEvent.objects.filter(owner=alice, title="Review meeting")
    start = timezone.localtime(meeting.start)
    assert (start.date(), start.hour) == (timezone.localdate() + timedelta(days=1), 14)


def test_request_bytes_extend_when_messages_are_appended():
    tool = {"type": "function", "function": {"name": "use_skill", "description": "Ré", "parameters": {}}}
    first = {"tools": [tool], "messages": [{"role": "system", "content": "static"}, {"role": "user", "content": "x"}]}
    second = {"tools": [tool], "messages": [*first["messages"], {"role": "assistant", "content": "y"}]}
    assert tokens.request_bytes(second).startswith(tokens.request_bytes(first))
    assert "Ré".encode() in tokens.request_bytes(first)  # UTF-8, not \\u escapes
    assert tokens.role_of(first) == SUB_AGENT and tokens.role_of({"tools": [], "messages": []}) == ORCHESTRATOR


def test_the_bench_command_prints_and_writes_the_figures(transactional_db, tmp_path, capsys):
    output = tmp_path / "tokens.json"
    assert bench_main(["bench", "--workloads", "tokens", "--force", "--tokens-output", str(output)]) == 0

    report = json.loads(output.read_text())
    assert report["request"] == tokens.SEED and len(report["calls"]) == 9
    assert set(report["roles"]) == {ORCHESTRATOR, SUB_AGENT}
    printed = capsys.readouterr().out
    assert "Token economy on the seed example" in printed
    assert printed.count("(aim ≤ ") == 2 and ("PASS" in printed or "MISS" in printed)


def test_without_a_tokenizer_tokens_are_bytes_over_four_and_say_so(monkeypatch):
    monkeypatch.setattr(tokens, "_encoding", lambda: None)
    assert tokens.count_tokens(b"12345") == 2
    assert tokens.token_unit() == "≈ tokens (bytes/4)"
