"""The engine end to end: orchestrator, sub-agents, DAG scheduling, events."""

from __future__ import annotations

import json

import pytest
from django.core import mail

from orchestration.models import AgentDispatch, Event, LLMCall, Message, SkillExecution
from skills.domains.tasks.models import Task
from tests.support.llm_server import Agent, Plan, Reply, agent_of, calls, http_error, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.replayed]

SEARCH = ("tasks.search", {"status": "open"})


def email(n: int = 1) -> tuple[str, dict]:
    return ("email.send", {"to": ["bob@example.com"], "subject": f"Report {n}", "body": "Hello Bob"})


def is_agent(request: dict, agent_id: str) -> bool:
    names = {tool["function"]["name"] for tool in request.get("tools", [])}
    return "use_skill" in names and agent_of(request) == agent_id


def dispatch(turn, agent_id) -> AgentDispatch:
    return AgentDispatch.objects.get(turn=turn, agent_id=agent_id)


def agent_events(dispatch_: AgentDispatch) -> list[str]:
    return [e.type for e in Event.objects.filter(dispatch=dispatch_, type__startswith="agent.subagent_").order_by("id")]


def answer(turn) -> str:
    """The model's answer, or (none: stopped, failed) the engine's last notice; the engine's
    record of side effects follows an answer and is not it."""
    message = (turn.messages.filter(role="assistant", tool_calls=[]).order_by("-seq").first()
               or turn.messages.filter(role="notice").order_by("-seq").first())
    return message.content


def tool_results(turn, name: str) -> list[dict]:
    """The results the orchestrator got for its calls of tool `name`."""
    ids = [c["id"] for m in turn.messages.filter(role="assistant") for c in m.tool_calls if c["function"]["name"] == name]
    return [json.loads(turn.messages.get(tool_call_id=i).content) for i in ids]


def test_diamond_runs_in_dependency_order(llm, run_turn):
    llm.respond = Plan([
        Agent("a", ["tasks.search"], [SEARCH], report="a found 0 tasks"),
        Agent("b", ["tasks.search"], [SEARCH]),
        Agent("c", ["tasks.search"], [SEARCH], depends_on=["a", "b"]),
        Agent("d", ["email.send"], [email()], depends_on=["c"]),
    ], answer="Diamond done.")
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert answer(turn) == "Diamond done."
    a, b, c, d = (dispatch(turn, x) for x in "abcd")
    assert c.started_at >= max(a.finished_at, b.finished_at)
    assert d.started_at >= c.finished_at
    assert {x.state for x in (a, b, c, d)} == {"closed"}
    assert {x.outcome for x in (a, b, c, d)} == {"completed"}
    assert len(mail.outbox) == 1
    # c saw its dependencies' results in its first message
    c_request = next(r for r in llm.requests if "mission:c" in json.dumps(r["messages"]))
    assert "Results from prior agents" in c_request["messages"][1]["content"]
    assert "a found 0 tasks" in c_request["messages"][1]["content"]
    results = tool_results(turn, "get_agent_results")[0]["agents"]
    assert [r["agent_id"] for r in results] == ["a", "b", "c", "d"]
    assert all(r["status"] == "completed" and r["tool_calls_used"] == 1 for r in results)


def test_event_sequence_per_sub_agent(llm, run_turn):
    llm.respond = Plan([Agent("solo", ["tasks.search"], [SEARCH, SEARCH])])
    turn = run_turn()
    solo = dispatch(turn, "solo")
    assert agent_events(solo) == [
        "agent.subagent_created", "agent.subagent_started",
        "agent.subagent_waiting_for_merge", "agent.subagent_closed",
    ]
    closed = Event.objects.get(dispatch=solo, type="agent.subagent_closed")
    assert closed.payload["sub_agent_id"] == "solo"
    assert closed.payload["final_status"] == "completed"
    assert closed.payload["close_reason"] == "merged"
    assert "step_idx" in closed.payload
    types = list(Event.objects.filter(turn=turn).values_list("type", flat=True))
    assert types[0] == "turn.started" and types[-1] == "turn.completed"
    assert types.count("skill.started") == types.count("skill.finished") == 2


def test_chain_runs_in_series(llm, run_turn):
    agents = [Agent("s1", ["tasks.search"], [SEARCH])]
    for i in range(2, 5):
        agents.append(Agent(f"s{i}", ["tasks.search"], [SEARCH], depends_on=[f"s{i-1}"]))
    llm.respond = Plan(agents)
    turn = run_turn()
    assert turn.status == "completed"
    chain = [dispatch(turn, f"s{i}") for i in range(1, 5)]
    for earlier, later in zip(chain, chain[1:]):
        assert later.started_at >= earlier.finished_at


def test_dependency_failure_skips_transitive_dependents(llm, run_turn):
    plan = Plan([
        Agent("root", ["tasks.search"], [SEARCH]),
        Agent("mid", ["tasks.search"], [SEARCH], depends_on=["root"]),
        Agent("leaf", ["email.send"], [email()], depends_on=["mid"]),
        Agent("free", ["tasks.search"], [SEARCH]),
    ])

    def respond(request):
        if is_agent(request, "root"):
            return http_error(400, "model refuses")  # permanent: no retry
        return plan(request)

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed"
    root, mid, leaf, free = (dispatch(turn, x) for x in ["root", "mid", "leaf", "free"])
    assert root.outcome == "failed" and "400" in root.error
    assert mid.outcome == leaf.outcome == "skipped"
    assert mid.result == leaf.result == "dependency root failed"
    assert mid.close_reason == leaf.close_reason == "dependency root failed"
    assert free.outcome == "completed"
    assert mail.outbox == []
    statuses = {r["agent_id"]: r["status"] for r in tool_results(turn, "get_agent_results")[0]["agents"]}
    assert statuses == {"root": "failed", "mid": "skipped", "leaf": "skipped", "free": "completed"}
    assert agent_events(mid) == ["agent.subagent_created", "agent.subagent_closed"]


def test_ungranted_skill_is_refused_at_run_time(llm, run_turn):
    llm.respond = Plan([Agent("sneaky", ["tasks.search"], [email()])])
    turn = run_turn()
    sneaky = dispatch(turn, "sneaky")
    execution = SkillExecution.objects.get(dispatch=sneaky)
    assert execution.skill == "email.send" and execution.status == "failed"
    assert "not granted" in execution.error or "granted" in execution.error
    assert mail.outbox == []
    assert turn.status == "completed"


def test_tool_budget_ends_agent_with_partial_result(llm, run_turn):
    llm.respond = Plan([Agent("busy", ["tasks.search"], [SEARCH] * 4, extra={"max_tool_calls": 2})])
    turn = run_turn()
    busy = dispatch(turn, "busy")
    assert busy.outcome == "budget_exceeded"
    assert busy.tool_calls_used == 2
    assert SkillExecution.objects.filter(dispatch=busy).count() == 2
    assert "tool budget of 2 calls spent" in busy.result
    [result] = tool_results(turn, "get_agent_results")[0]["agents"]
    assert result["status"] == "completed"


def test_parallel_tool_calls_in_one_agent_response(llm, run_turn):
    llm.respond = Plan([Agent("wide", ["tasks.search", "tasks.create"], [
        ("tasks.create", {"title": "one"}), ("tasks.create", {"title": "two"})], per_call=2)])
    turn = run_turn()
    assert turn.status == "completed"
    assert sorted(Task.objects.values_list("title", flat=True)) == ["one", "two"]


class TestOrchestratorValidation:
    def run_with(self, llm, run_turn, first: Reply):
        """The model's first reply is `first`; then it answers with what it got back."""

        def respond(request):
            tool_messages = [m for m in request["messages"] if m["role"] == "tool"]
            notes = [m for m in request["messages"] if m["role"] == "user" and m["content"].startswith("[engine note]")]
            if not tool_messages and not notes:
                return first
            last = (tool_messages or notes)[-1]["content"]
            return text(f"Saw: {last}")

        llm.respond = respond
        turn = run_turn()
        assert turn.status == "completed", turn.error
        return answer(turn)

    def dispatch_error(self, llm, run_turn, **arguments) -> str:
        spec = {"agent_id": "x", "mission": "m", "skills": ["tasks.search"], **arguments}
        return self.run_with(llm, run_turn, calls(("dispatch_agent", spec)))

    def test_malformed_json_arguments(self, llm, run_turn):
        reply = self.run_with(llm, run_turn, calls(("dispatch_agent", '{"agent_id": "x", "mission": ')))
        assert "not valid JSON" in reply

    def test_unknown_tool(self, llm, run_turn):
        reply = self.run_with(llm, run_turn, calls(("use_skill", {"skill": "email.send"})))
        assert "unknown tool 'use_skill'" in reply
        assert "get_skill, dispatch_agent, get_agent_results" in reply

    def test_wrong_types(self, llm, run_turn):
        reply = self.dispatch_error(llm, run_turn, skills="tasks.search")
        assert "'skills' must be an array" in reply
        assert not AgentDispatch.objects.exists()

    def test_missing_fields(self, llm, run_turn):
        reply = self.run_with(llm, run_turn, calls(("dispatch_agent", {"agent_id": "x"})))
        assert "missing required field 'mission'" in reply and "missing required field 'skills'" in reply

    def test_unknown_skill(self, llm, run_turn):
        reply = self.dispatch_error(llm, run_turn, skills=["tasks.explode"])
        assert "unknown skills ['tasks.explode']" in reply

    def test_unknown_depends_on(self, llm, run_turn):
        reply = self.dispatch_error(llm, run_turn, depends_on=["ghost"])
        assert "depends_on names unknown agents ['ghost']" in reply

    def test_self_dependency_is_a_cycle(self, llm, run_turn):
        reply = self.dispatch_error(llm, run_turn, depends_on=["x"])
        assert "cycle" in reply

    def test_cycle_across_the_batch_is_refused(self, llm, run_turn):
        first = calls(
            ("dispatch_agent", {"agent_id": "p", "mission": "m", "skills": ["tasks.search"], "depends_on": ["q"]}),
            ("dispatch_agent", {"agent_id": "q", "mission": "m", "skills": ["tasks.search"], "depends_on": ["p"]}),
        )
        reply = self.run_with(llm, run_turn, first)
        assert "cycle" in reply
        assert not AgentDispatch.objects.exists()

    def test_duplicate_agent_id(self, llm, run_turn):
        spec = {"agent_id": "twin", "mission": "m", "skills": ["tasks.search"]}
        first = calls(("dispatch_agent", spec), ("dispatch_agent", spec))

        def respond(request):
            if "use_skill" in json.dumps(request.get("tools")):
                return text("agent report")
            tool_messages = [m for m in request["messages"] if m["role"] == "tool"]
            if not tool_messages:
                return first
            if len(tool_messages) == 2:
                return calls(("get_agent_results", {}), prefix="r")
            return text("Saw: " + " | ".join(m["content"] for m in tool_messages))

        llm.respond = respond
        turn = run_turn()
        assert "already used in this turn" in answer(turn)
        assert AgentDispatch.objects.filter(turn=turn).count() == 1

    def test_empty_response_gets_a_note(self, llm, run_turn):
        reply = self.run_with(llm, run_turn, text(""))
        assert "Your reply was empty" in reply

    def test_truncated_response_gets_a_note(self, llm, run_turn):
        reply = self.run_with(llm, run_turn, text("The answer is", finish_reason="length"))
        assert "cut off" in reply

    def test_not_a_completion_fails_the_turn_visibly(self, llm, run_turn):
        llm.respond = lambda request: Reply(body="<html>bad gateway</html>")
        turn = run_turn()
        assert turn.status == "failed"
        assert "model" in turn.error.lower()
        assert Event.objects.filter(turn=turn, type="turn.failed").exists()
        assert "this turn failed" in answer(turn)

    @pytest.mark.parametrize("body", [
        "[]", '{"choices": "none"}', '{"choices": [{"message": "hi"}]}',
        '{"choices": [{"message": {"tool_calls": [{"id": "c1", "function": "get_skill"}]}}]}',
        '{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens_details": 3}}',
    ])
    def test_json_of_the_wrong_shape_fails_the_turn_visibly(self, llm, run_turn, body):
        """The answer is read as JSON, not through the SDK's models: any shape it does not
        expect is an unusable response (retried, then the turn fails saying so)."""
        llm.respond = lambda request: Reply(body=body)
        turn = run_turn()
        assert turn.status == "failed"
        assert "LLM response unusable" in turn.error
        assert Event.objects.filter(turn=turn, type="turn.failed").exists()

    def test_arguments_sent_as_an_object_are_read_as_their_json(self, llm, run_turn):
        """Some compatible servers send a tool call's arguments as an object, not a string."""
        answered = '{"choices": [{"message": {"content": "Done."}, "finish_reason": "stop"}]}'
        as_object = json.dumps({"choices": [{"message": {"content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_skill", "arguments": {"domain": "tasks"}}}]},
            "finish_reason": "tool_calls"}]})
        llm.respond = lambda request: Reply(body=answered if any(m["role"] == "tool" for m in request["messages"])
                                            else as_object)
        turn = run_turn()
        assert turn.status == "completed", turn.error
        assert tool_results(turn, "get_skill")[0]["domain"] == "tasks"


def test_get_agent_results_reports_unknown_ids(llm, run_turn):
    def respond(request):
        tool_messages = [m for m in request["messages"] if m["role"] == "tool"]
        if not tool_messages:
            return calls(("get_agent_results", {"agent_ids": ["nobody"]}))
        return text(tool_messages[-1]["content"])

    llm.respond = respond
    turn = run_turn()
    assert json.loads(answer(turn)) == {"agents": [{"agent_id": "nobody", "status": "not_found"}]}


def test_transient_agent_failure_is_retried_and_side_effects_run_once(llm, run_turn):
    plan = Plan([Agent("mailer", ["email.send"], [email()])])
    failures = []

    def respond(request):
        has_results = any(m["role"] == "tool" for m in request["messages"])
        if is_agent(request, "mailer") and has_results and not failures:
            failures.append(1)
            return http_error(503, "overloaded")
        return plan(request)

    llm.respond = respond
    turn = run_turn()
    mailer = dispatch(turn, "mailer")
    assert mailer.outcome == "completed", mailer.error
    assert mailer.retries == 1
    assert len(mail.outbox) == 1  # the retry replayed the stored email.send result
    assert "agent.subagent_attempt" in agent_events(mailer)


def test_usage_is_stored_per_call_and_summed(llm, run_turn):
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    turn = run_turn()
    a = dispatch(turn, "a")
    assert LLMCall.objects.filter(dispatch=a).count() == a.llm_calls == 2
    assert a.prompt_tokens == 200 and a.completion_tokens == 40
    orchestrator_calls = LLMCall.objects.filter(turn=turn, dispatch=None).count()
    assert turn.llm_iterations == orchestrator_calls == 4
    assert turn.prompt_tokens == 100 * (orchestrator_calls + 2)


def test_history_holds_orchestrator_traffic_not_agent_traces(llm, run_turn):
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    turn = run_turn()
    roles = list(turn.messages.values_list("role", flat=True))
    assert roles[0] == "user" and roles[-1] == "assistant"
    assert not Message.objects.filter(tool_call_id__startswith="a_c").exists()
    assert dispatch(turn, "a").transcript  # the agent's trace lives on its dispatch


def test_second_message_while_running_is_refused(transactional_db, alice):
    from orchestration.lifecycle.turns import TurnRefused, turn_start
    from tests.factories import conversation_for

    conversation = conversation_for(alice)
    turn_start(conversation=conversation, text="first")  # not run: no worker, not inline
    with pytest.raises(TurnRefused, match="still running"):
        turn_start(conversation=conversation, text="second")


def test_reused_tool_call_ids_still_run_each_call(llm, run_turn):
    """Some servers number tool calls per response ('call_0' every time): each step's
    call is still a new call, not a replay of the first one's stored result."""
    plan = Plan([Agent("maker", ["tasks.create"], [("tasks.create", {"title": "one"}), ("tasks.create", {"title": "two"})])])

    def respond(request):
        reply = plan(request)
        if is_agent(request, "maker") and reply.tool_calls:
            reply.tool_calls = [("call_0", name, args) for _, name, args in reply.tool_calls]
        return reply

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert sorted(Task.objects.values_list("title", flat=True)) == ["one", "two"]
    maker = dispatch(turn, "maker")
    assert SkillExecution.objects.filter(dispatch=maker).count() == 2
    ids = [m["tool_call_id"] for m in maker.transcript if m["role"] == "tool"]
    assert len(set(ids)) == 2
