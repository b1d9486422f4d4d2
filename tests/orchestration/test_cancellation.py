"""Stop during a running turn (issue 5): running and pending agents are cancelled
cooperatively, and nothing runs for the turn afterwards."""

from __future__ import annotations

import pytest
from django.db import connection

from orchestration.models import AgentDispatch, Event, LLMCall, SkillExecution
from orchestration.lifecycle.turns import turn_stop
from skills.domains.tasks.models import Task
from tests.support.llm_server import Agent, Plan, agent_of

pytestmark = pytest.mark.django_db(transaction=True)


def create(title: str) -> tuple[str, dict]:
    return ("tasks.create", {"title": title})


def is_agent(request: dict) -> bool:
    return any(tool["function"]["name"] == "use_skill" for tool in request.get("tools", []))


def test_stop_mid_turn_cancels_running_and_pending_agents(llm, run_turn, alice):
    plan = Plan([
        Agent("worker", ["tasks.create"], [create("one"), create("two"), create("three")]),
        Agent("queued", ["tasks.create"], [create("queued")]),  # ready, but after worker in the queue
        Agent("later", ["tasks.create"], [create("later")], depends_on=["worker"]),
    ])
    at_stop = {}

    def respond(request):
        reply = plan(request)
        tool_results = sum(1 for m in request["messages"] if m["role"] == "tool")
        if is_agent(request) and agent_of(request) == "worker" and tool_results == 1 and not at_stop:
            # The owner clicks Stop while the worker waits for its 2nd LLM answer. This
            # runs in the server's thread, on its own database connection.
            try:
                worker = AgentDispatch.objects.select_related("turn").get(agent_id="worker")
                turn_stop(turn=worker.turn, user=alice)
                at_stop["requests"] = len(llm.requests)
                at_stop["event_id"] = Event.objects.latest("id").pk
            finally:
                connection.close()
        return reply

    llm.respond = respond
    turn = run_turn()
    assert at_stop, "the stop did not happen"
    assert llm.errors == []
    assert turn.status == "stopped"
    worker, queued, later = (AgentDispatch.objects.get(agent_id=x) for x in ("worker", "queued", "later"))
    # the worker finished its current step (the answer being delivered) and went no further
    assert (worker.state, worker.outcome) == ("closed", "cancelled")
    assert worker.close_reason.startswith("cancelled")
    assert list(Task.objects.values_list("title", flat=True)) == ["one"]
    assert SkillExecution.objects.filter(dispatch=worker).count() == 1
    # the agents that had not started are cancelled, and never started afterwards
    for pending in (queued, later):
        assert (pending.state, pending.outcome) == ("closed", "cancelled")
        assert pending.started_at is None
        assert [e.type for e in Event.objects.filter(dispatch=pending, type__startswith="agent.subagent_")] == [
            "agent.subagent_created", "agent.subagent_closed"]
    # nothing ran for the turn after the stop: no LLM call (orchestrator or agent); the
    # one event is the answer the worker was waiting for: paid for, in the audit, so in
    # the timeline too, where the page's counters follow it to the audit's figures
    assert len(llm.requests) == at_stop["requests"]
    late = Event.objects.filter(turn=turn, pk__gt=at_stop["event_id"])
    assert [(e.type, e.dispatch_id, e.summary) for e in late] == [
        ("agent.llm_call", worker.pk, "worker step 2: answered too late to act on")]
    assert late[0].payload["usage"]["prompt_tokens"] == LLMCall.objects.get(dispatch=worker, key__endswith=":s1").prompt_tokens
    assert LLMCall.objects.filter(turn=turn, dispatch=None).count() == turn.llm_iterations == 2
    closed = Event.objects.get(dispatch=worker, type="agent.subagent_closed")
    assert closed.payload["close_reason"] == "cancelled" and closed.payload["final_status"] == "failed"
    assert "Stopped at your request" in turn.messages.filter(role="notice").last().content


def test_a_cancelled_agent_notices_at_its_next_step(llm, run_turn, alice, monkeypatch):
    """Stopped right after a skill call: the step ends, the next step sees the stop."""
    from orchestration.engine import agent as subagent

    llm.respond = Plan([Agent("worker", ["tasks.create"], [create("one"), create("two")])])
    use_skill = subagent._use_skill
    stopped = []

    def use_skill_then_stop(dispatch, token, user, call, seen):
        content = use_skill(dispatch, token, user, call, seen)
        if not stopped:
            turn_stop(turn=dispatch.turn, user=alice)
            stopped.append(len(llm.requests))
        return content

    monkeypatch.setattr(subagent, "_use_skill", use_skill_then_stop)
    checks = []
    check = subagent.Agent.check

    def recorded_check(self, **progress):
        stop = check(self, **progress)
        if stop is not None:
            checks.append(stop.kind.value)
        return stop

    monkeypatch.setattr(subagent.Agent, "check", recorded_check)
    turn = run_turn()
    assert turn.status == "stopped"
    assert checks == ["stop"]
    worker = AgentDispatch.objects.get(agent_id="worker")
    assert (worker.state, worker.outcome) == ("closed", "cancelled")
    assert list(Task.objects.values_list("title", flat=True)) == ["one"]  # the running step finished
    assert len(llm.requests) == stopped[0]  # and nobody asked the model anything more
    assert [e.type for e in Event.objects.filter(dispatch=worker, type__startswith="agent.subagent_")] == [
        "agent.subagent_created", "agent.subagent_started", "agent.subagent_closed"]


def test_stop_between_parallel_skill_calls_runs_none_of_the_rest(llm, run_turn, alice, monkeypatch):
    """One response asks for three emails; Stop lands after the first: no more are sent."""
    from django.core import mail

    from orchestration.engine import agent as subagent

    send = [("email.send", {"to": ["bob@example.com"], "subject": f"Report {n}", "body": "Hi"}) for n in (1, 2, 3)]
    llm.respond = Plan([Agent("mailer", ["email.send"], send, per_call=3)])
    use_skill = subagent._use_skill

    def use_skill_then_stop(dispatch, token, user, call, seen):
        content = use_skill(dispatch, token, user, call, seen)
        if len(mail.outbox) == 1:
            turn_stop(turn=dispatch.turn, user=alice)
        return content

    monkeypatch.setattr(subagent, "_use_skill", use_skill_then_stop)
    turn = run_turn()
    assert turn.status == "stopped"
    assert [m.subject for m in mail.outbox] == ["Report 1"]
    mailer = AgentDispatch.objects.get(agent_id="mailer")
    assert (mailer.state, mailer.outcome) == ("closed", "cancelled")
    assert SkillExecution.objects.filter(dispatch=mailer).count() == 1


def test_a_stop_during_the_streamed_answer_keeps_what_had_streamed(alice):
    from tests.factories import conversation_for, dispatch_for, turn_for

    turn = turn_for(conversation_for(alice), answer_draft="Your files: **report.txt**, notes.md and")
    dispatch_for(turn, "list-files", state="closed", outcome="completed")
    turn_stop(turn=turn, user=alice)
    notice = turn.messages.get(role="notice").content
    assert notice.startswith("Stopped at your request. Completed: list-files.")
    assert notice.endswith("The answer so far:\n\nYour files: **report.txt**, notes.md and")
    turn.refresh_from_db()
    assert turn.answer_draft == ""
