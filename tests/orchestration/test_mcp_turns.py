"""MCP tools in turns, through the engine (inline tasks, the real openai SDK against the
scripted model server, the test MCP server over stdio): granted, approved and audited
like the built-ins, and a call whose answer was lost asks the owner."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from orchestration.lifecycle.turns import effect_domains, side_effects
from orchestration.models import AgentDispatch, SkillApproval, SkillExecution, Turn
from orchestration.questions.approvals import approval_answer
from orchestration.questions.pauses import pause_record
from orchestration.reports.audit import turn_audit
from skills.mcp import client as mcp_client
from skills.mcp import skills as mcp_skills
from tests.factories import conversation_for
from tests.support.llm_server import Agent, Plan
from tests.support.mcp_fixtures import lines, stdio_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals_on", "mcp_sessions")]

LOOKUP = ("mcp.tools.lookup", {"key": "printer"})
TICKET = ("mcp.tools.create_ticket", {"title": "Printer jam"})


def pending(turn) -> SkillApproval:
    return SkillApproval.objects.get(turn=turn, decision="")


def answer(turn, user, *, approve: bool) -> SkillApproval:
    asked = pending(turn)
    return approval_answer(turn=turn, user=user, approval_id=asked.pk, digest=asked.digest, approve=approve)


def test_an_agent_granted_mcp_tools_reads_then_asks_before_the_side_effect(llm, run_turn, alice, mcp_sessions):
    stdio_server(trust_read_only=True)
    llm.respond = Plan([Agent("clerk", ["mcp.tools.create_ticket", "mcp.tools.lookup"], [LOOKUP, TICKET],
                              report="Ticket filed.")])
    turn = run_turn("File a ticket about the printer")
    assert turn.status == "paused"
    asked = pending(turn)
    assert (asked.skill, asked.arguments, asked.kind) == (*TICKET, "approval")
    # The server's write policy asks; and what the lookup returned is another system's text.
    assert "mcp.tools.create_ticket asks first by default" in asked.reasons[0]
    assert "MCP server tools, tool lookup" in asked.reasons[-1]
    assert lines(mcp_sessions / "received.jsonl") == []
    answer(turn, alice, approve=True)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert lines(mcp_sessions / "tickets.jsonl") == [{"title": "Printer jam", "priority": 3}]
    rows = {row.skill: row for row in SkillExecution.objects.filter(dispatch__turn=turn)}
    assert rows["mcp.tools.lookup"].outside == ["MCP server tools, tool lookup"]
    assert rows["mcp.tools.create_ticket"].clearance["by"] == "owner"
    assert llm.errors == []


def test_the_orchestrator_cannot_grant_a_tool_of_a_server_the_user_may_not_use(llm, run_turn, alice, bob):
    server = stdio_server(everyone=False)
    server.users.add(bob)
    llm.respond = Plan([Agent("clerk", ["mcp.tools.lookup"], [LOOKUP])], discover=False)
    turn = run_turn("Look it up")
    assert turn.status == "completed"
    assert not turn.dispatches.exists()
    refusal = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "unknown skills ['mcp.tools.lookup']" in refusal


def test_an_mcp_servers_tools_are_listed_outside_every_transaction(llm, run_turn, alice, monkeypatch):
    """Listing may start the server's process or wait on its network, up to its timeouts:
    never while the turn's lock (on SQLite, the database's one writer) is held: not as a
    dispatch that grants one of its tools checks them, nor as the turn's ending lists its
    side effects."""
    stdio_server(trust_read_only=True)
    listed_in_transaction = []
    real = mcp_client.Hub.tools

    def tools(hub, config):
        listed_in_transaction.append(connection.in_atomic_block)
        return real(hub, config)

    monkeypatch.setattr(mcp_client.Hub, "tools", tools)
    llm.respond = Plan([Agent("clerk", ["mcp.tools.create_ticket"], [TICKET], report="Filed.")])
    turn = run_turn("File a ticket about the printer")
    answer(turn, alice, approve=True)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert turn.dispatches.get().skills == ["mcp.tools.create_ticket"]
    assert "- mcp.tools.create_ticket (title Printer jam" in turn.messages.filter(role="notice").last().content
    assert listed_in_transaction and not any(listed_in_transaction)


@pytest.fixture
def lost_once(monkeypatch):
    """The first answer of a side-effecting MCP call is lost after the server acted on it:
    the database fails as the worker would store it (the step is taken again)."""
    real = mcp_skills.result_data
    lost = []

    def result_data(config, user, result):
        if not lost:
            lost.append(result)
            raise OperationalError("database is locked")  # transient on either database
        return real(config, user, result)

    monkeypatch.setattr(mcp_skills, "result_data", result_data)
    return lost


@pytest.mark.parametrize("choice", ["go on as if it failed", "send it again"])
def test_a_side_effect_whose_answer_was_lost_asks_the_owner(choice, llm, run_turn, alice, mcp_sessions, lost_once):
    stdio_server(write_policy="allow")
    llm.respond = Plan([Agent("clerk", ["mcp.tools.create_ticket"], [TICKET], report="Done.")])
    turn = run_turn("File a ticket about the printer")
    assert lost_once, "the call was not made"
    assert turn.status == "paused", turn.error
    asked = pending(turn)
    assert asked.kind == "in_doubt" and (asked.skill, asked.arguments) == TICKET
    assert "nobody knows whether it happened" in asked.reasons[0]
    assert len(lines(mcp_sessions / "tickets.jsonl")) == 1  # it did happen, and was not sent again unasked

    answer(turn, alice, approve=choice == "send it again")
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    row = SkillExecution.objects.get(dispatch__turn=turn, skill="mcp.tools.create_ticket")
    pause = asked.pause
    pause.refresh_from_db()
    assert pause_record(pause) == ("Turn 1 paused on a call of mcp.tools.create_ticket in doubt: "
                                   f"alice chose to {choice}.")
    (paused,) = turn_audit(turn)["pauses"]
    assert (paused["label"], paused["answer"]) == ("a call of mcp.tools.create_ticket in doubt", f"chose to {choice}")
    if choice == "send it again":
        assert row.status == "completed"
        assert len(lines(mcp_sessions / "tickets.jsonl")) == 2  # the owner's word: once more
    else:
        assert (row.status, row.result["error_kind"]) == ("failed", "in_doubt")
        assert row.clearance["in_doubt"]["answer"] == "go on as if it failed"
        assert len(lines(mcp_sessions / "tickets.jsonl")) == 1
        assert "Whether mcp.tools.create_ticket happened is not known" in turn.messages.last().content


def test_a_server_that_is_down_is_unavailable_to_the_orchestrator_not_a_failed_turn(llm, run_turn, alice):
    from skills.mcp.models import McpServer

    McpServer.objects.create(name="gone", command="/nonexistent/mcp-server", everyone=True)
    llm.respond = Plan([Agent("clerk", ["mcp.gone.create_ticket"], [TICKET])], discover=False)
    turn = run_turn("File a ticket")
    assert turn.status == "completed", turn.error
    system = llm.requests[0]["messages"][0]["content"]
    assert "mcp.gone: Tools of the MCP server gone. (unavailable now: cannot reach MCP server gone" in system
    refusal = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "mcp.gone is unavailable now: cannot reach MCP server gone" in refusal
    assert not turn.dispatches.exists()


def test_a_side_effect_of_a_server_gone_since_is_still_listed(alice):
    """The turn's ending describes its side effects from the tools' descriptions; a
    server removed (or down) since cannot describe its call, which is still listed."""
    turn = Turn.objects.create(conversation=conversation_for(alice), number=1)
    dispatch = AgentDispatch.objects.create(turn=turn, agent_id="clerk", mission="m", skills=[])
    SkillExecution.objects.create(dispatch=dispatch, skill="mcp.gone.create_ticket", tool_call_id="c1",
                                  arguments={"title": "Printer jam"}, status="completed", result={"ok": True})
    assert side_effects(turn, effect_domains(turn.pk)) == [
        "mcp.gone.create_ticket (its server is not reachable now to describe it)"]
