"""The engine's promises under a provider that behaves like real ones (issue 13).

Every turn ends, whatever graph the model sends; a retry resumes the failed model call
and never repeats a side effect, with fresh random tool-call ids (the scripted server's
default) or `call_0` reused in every response; budgets are per agent; nested skill calls
are granted and counted like direct ones; a turn that ends closes every agent.

The real openai SDK talks to the scripted server over HTTP; tasks run inline.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from orchestration.models import AgentDispatch, Event, LLMCall, SkillExecution, TurnPause
from orchestration.questions.pauses import turn_continue
from orchestration.lifecycle.turns import turn_start, turn_stop
from skills import registry
from skills.base import Domain, Skill
from skills.executor import execute_skill
from skills.domains.tasks.models import Task
from tests.factories import conversation_for
from tests.support.llm_server import Agent, Plan, Reply, agent_of, calls, http_error, text, with_burst

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.replayed]

SEARCH = ("tasks.search", {"status": "open"})
EMAIL = ("email.send", {"to": ["bob@example.com"], "subject": "Report", "body": "Hello Bob"})


@pytest.fixture
def limits(settings):
    def set_limits(**values):
        settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, **values}

    return set_limits


def is_agent(request: dict, agent_id: str) -> bool:
    names = {tool["function"]["name"] for tool in request.get("tools", [])}
    return "use_skill" in names and agent_of(request) == agent_id


def is_orchestrator(request: dict) -> bool:
    return "use_skill" not in {tool["function"]["name"] for tool in request.get("tools", [])}


def tool_results_in(request: dict) -> int:
    return sum(1 for m in request["messages"] if m["role"] == "tool")


def requests_of(llm, agent_id: str) -> list[dict]:
    return [r for r in llm.requests if is_agent(r, agent_id)]


def dispatch_spec(agent_id: str, depends_on: list[str] | None = None, skills=("tasks.search",)) -> dict:
    spec = {"agent_id": agent_id, "mission": f"mission:{agent_id}", "skills": list(skills)}
    if depends_on is not None:
        spec["depends_on"] = depends_on
    return spec


def orchestrator_script(*batches: list[dict], agents: dict[str, Reply] | None = None):
    """The orchestrator sends each batch of dispatch_agent calls in turn, then
    get_agent_results, then answers with what it got; agents answer `agents[id]` (a
    plain report by default)."""

    def respond(request: dict) -> Reply:
        if not is_orchestrator(request):
            agent_id = agent_of(request)
            if agent_id in (agents or {}) and not tool_results_in(request):
                return agents[agent_id]
            return text(f"{agent_id} done")
        sent = sum(1 for m in request["messages"] if m["role"] == "assistant")
        if sent < len(batches):
            return calls(*[("dispatch_agent", spec) for spec in batches[sent]])
        if sent == len(batches):
            return calls(("get_agent_results", {}))
        return text("Results: " + [m for m in request["messages"] if m["role"] == "tool"][-1]["content"])

    return respond


def dispatch_answers(turn) -> dict[str, dict]:
    """What the orchestrator was told for each dispatch_agent call, by agent_id asked for."""
    answers = {}
    for message in turn.messages.filter(role="assistant").order_by("seq"):
        for call in message.tool_calls:
            if call["function"]["name"] == "dispatch_agent":
                asked = json.loads(call["function"]["arguments"])["agent_id"]
                answers.setdefault(asked, []).append(json.loads(turn.messages.get(tool_call_id=call["id"]).content))
    return answers


def results(turn) -> dict[str, dict]:
    """The orchestrator's get_agent_results answer, by agent_id."""
    message = turn.messages.filter(role="tool", content__startswith='{"agents"').order_by("-seq").first()
    return {agent["agent_id"]: agent for agent in json.loads(message.content)["agents"]}


# --- any batch ends ----------------------------------------------------------------------


def test_a_batch_with_two_cycles_and_dependents_of_both_ends_the_turn(llm, run_turn):
    batch = [
        dispatch_spec("a", ["b"]), dispatch_spec("b", ["a"]),  # a cycle
        dispatch_spec("c", ["c"]),  # a self-loop
        dispatch_spec("d", ["a"]), dispatch_spec("e", ["d"]),  # dependents of the first cycle
        dispatch_spec("f", ["c"]),  # a dependent of the second
        dispatch_spec("g"), dispatch_spec("h", ["g"]),  # fine
    ]
    llm.respond = orchestrator_script(batch)
    turn = run_turn()

    assert turn.status == "completed", turn.error
    answers = {agent_id: told[0] for agent_id, told in dispatch_answers(turn).items()}
    for agent_id in "abc":
        assert "cycle" in answers[agent_id]["error"], answers[agent_id]
    assert "refused in this batch" in answers["d"]["error"] and "a" in answers["d"]["error"]
    assert "refused in this batch" in answers["e"]["error"] and "d" in answers["e"]["error"]
    assert "refused in this batch" in answers["f"]["error"]
    assert [answers[x]["status"] for x in "gh"] == ["dispatched", "dispatched"]
    assert sorted(AgentDispatch.objects.filter(turn=turn).values_list("agent_id", flat=True)) == ["g", "h"]
    assert {agent_id: r["status"] for agent_id, r in results(turn).items()} == {"g": "completed", "h": "completed"}
    assert turn.agents_dispatched == 2  # refused agents take no slot


def test_an_agent_depending_on_one_that_already_failed_is_refused(llm, run_turn):
    """A later batch cannot wait on an agent of an earlier one that failed."""

    def respond(request):
        if is_agent(request, "x"):
            return http_error(400, "model refuses")  # permanent: no retry
        if is_orchestrator(request):
            sent = sum(1 for m in request["messages"] if m["role"] == "assistant")
            if sent == 1:
                return calls(("get_agent_results", {}))
            if sent == 2:
                return calls(("dispatch_agent", dispatch_spec("y", ["x"])))
            if sent == 3:
                return text("Told: " + [m for m in request["messages"] if m["role"] == "tool"][-1]["content"])
        return orchestrator_script([dispatch_spec("x")])(request)

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    told = dispatch_answers(turn)["y"][0]
    assert "ended without success: x (failed)" in told["error"]
    assert not AgentDispatch.objects.filter(turn=turn, agent_id="y").exists()


def test_a_dependent_of_a_failure_is_skipped_with_the_root_cause(llm, run_turn):
    def respond(request):
        if is_agent(request, "root"):
            return http_error(400, "model refuses")
        return orchestrator_script([dispatch_spec("root"), dispatch_spec("mid", ["root"]),
                                    dispatch_spec("leaf", ["mid"])])(request)

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    statuses = {agent_id: (r["status"], r["result"]) for agent_id, r in results(turn).items()}
    assert statuses["mid"] == statuses["leaf"] == ("skipped", "dependency root failed")
    leaf = AgentDispatch.objects.get(turn=turn, agent_id="leaf")
    assert (leaf.state, leaf.outcome, leaf.started_at) == ("closed", "skipped", None)
    closed = Event.objects.get(dispatch=leaf, type="agent.subagent_closed")
    assert closed.payload["close_reason"] == "skipped" and closed.payload["detail"] == "dependency root failed"


# --- a retry resumes, it does not restart ------------------------------------------------


@pytest.mark.parametrize("ids", ["fresh", "reused"])
def test_an_agent_that_sent_an_email_then_hits_a_5xx_burst_sends_it_once(llm, run_turn, settings, ids):
    """The burst outlasts the SDK's own retry; the engine asks again with the transcript
    as it stood, so the finished email.send is never asked for again."""
    settings.ASSISTANT_LLM_MAX_RETRIES = 1
    llm.ids = ids
    plan = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed Bob.")], answer="Sent.")
    llm.respond = burst = with_burst(plan, count=2, status=503,
                                     when=lambda r: is_agent(r, "mailer") and tool_results_in(r) == 1)
    turn = run_turn()

    assert turn.status == "completed", turn.error
    mailer = AgentDispatch.objects.get(turn=turn, agent_id="mailer")
    assert (mailer.outcome, mailer.retries, mailer.result) == ("completed", 1, "Mailed Bob.")
    assert burst.failed == 2
    assert len(mail.outbox) == 1
    assert SkillExecution.objects.filter(dispatch=mailer).count() == 1
    asked = requests_of(llm, "mailer")
    # the first call, then the one after the email three times (SDK try, SDK retry, engine retry)
    assert [tool_results_in(r) for r in asked] == [0, 1, 1, 1]
    assert asked[1]["messages"] == asked[2]["messages"] == asked[3]["messages"]
    assert LLMCall.objects.filter(dispatch=mailer).count() == 2
    retry = Event.objects.get(dispatch=mailer, type="agent.subagent_attempt")
    assert retry.payload["retry"] == 1 and retry.payload["step"] == 1 and "503" in retry.payload["reason"]


def test_reused_ids_across_responses_run_each_call_once(llm, run_turn):
    """`call_0` in every response: each step's call is a new call, and a replay of the
    agent (a retry here) runs none of them again."""
    llm.ids = "reused"
    plan = Plan([Agent("maker", ["tasks.create"], [("tasks.create", {"title": "one"}),
                                                    ("tasks.create", {"title": "two"})])])
    llm.respond = with_burst(plan, count=1, when=lambda r: is_agent(r, "maker") and tool_results_in(r) == 2)
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert sorted(Task.objects.values_list("title", flat=True)) == ["one", "two"]
    assert SkillExecution.objects.filter(dispatch__turn=turn).count() == 2


def test_the_orchestrators_calls_are_retried_too(llm, run_turn):
    plan = Plan([Agent("a", ["tasks.search"], [SEARCH])], answer="Done after a hiccup.")
    llm.respond = with_burst(plan, count=2, status=502, when=lambda r: is_orchestrator(r) and tool_results_in(r) == 2)
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert turn.llm_retries == 2
    retries = Event.objects.filter(turn=turn, type="orchestrator.llm_retry").order_by("id")
    assert [e.payload["retry"] for e in retries] == [1, 2]
    assert AgentDispatch.objects.get(turn=turn).llm_calls == 2  # the agent was not run again


def test_past_its_retries_the_orchestrator_fails_the_turn_visibly(llm, run_turn, limits):
    limits(orchestrator_max_retries=1)
    llm.respond = with_burst(Plan([]), count=10, status=500, when=is_orchestrator)
    turn = run_turn()
    assert turn.status == "failed"
    assert "500" in turn.error and turn.llm_retries == 1
    assert len(llm.requests) == 2


def test_retries_are_counted_per_agent_across_steps(llm, run_turn, limits):
    """One retry per agent: a second burst at a later step is not given a fresh one."""
    limits(agent_max_retries=1)
    plan = Plan([Agent("flaky", ["tasks.search"], [SEARCH, SEARCH])])
    first = with_burst(plan, count=1, when=lambda r: is_agent(r, "flaky") and tool_results_in(r) == 1)
    llm.respond = with_burst(first, count=1, when=lambda r: is_agent(r, "flaky") and tool_results_in(r) == 2)
    turn = run_turn()
    assert turn.status == "completed", turn.error
    flaky = AgentDispatch.objects.get(turn=turn)
    assert (flaky.outcome, flaky.retries) == ("failed", 1)
    assert "503" in flaky.error
    assert SkillExecution.objects.filter(dispatch=flaky).count() == 2


# --- budgets are per agent ---------------------------------------------------------------


def test_the_token_budget_spans_a_retry(llm, run_turn, limits):
    """Each response costs 120 tokens; with a budget of 350 the agent gets 3 model calls
    whatever failed between them (a restart used to give it a fresh budget)."""
    limits(agent_token_budget=350)
    plan = Plan([Agent("reader", ["tasks.search"], [SEARCH] * 5, extra={"max_tool_calls": 10})])
    llm.respond = with_burst(plan, count=1, when=lambda r: is_agent(r, "reader") and tool_results_in(r) == 2)
    turn = run_turn()
    reader = AgentDispatch.objects.get(turn=turn)
    assert reader.outcome == "budget_exceeded" and "token budget of 350 spent" in reader.result
    assert (reader.llm_calls, reader.tool_calls_used, reader.retries) == (3, 3, 1)
    assert reader.prompt_tokens + reader.completion_tokens == 360


def test_an_agent_whose_replies_are_always_empty_stops_after_a_few_nudges(llm, run_turn):
    plan = Plan([Agent("mute", ["tasks.search"])])

    def respond(request):
        if is_agent(request, "mute"):
            return text("")
        return plan(request)

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    mute = AgentDispatch.objects.get(turn=turn)
    assert mute.outcome == "failed" and "no usable reply" in mute.error
    assert len(requests_of(llm, "mute")) == 3


def test_an_agent_that_only_calls_tools_it_lacks_stops_too(llm, run_turn):
    plan = Plan([Agent("lost", ["tasks.search"])])

    def respond(request):
        if is_agent(request, "lost"):
            return calls(("browse_web", {"url": "https://example.com"}))
        return plan(request)

    llm.respond = respond
    turn = run_turn()
    lost = AgentDispatch.objects.get(turn=turn)
    assert lost.outcome == "failed" and "unknown tools" in lost.error
    assert len(requests_of(llm, "lost")) == 3


def test_the_wall_clock_counts_from_the_first_start(llm, queued, alice, limits):
    """A redelivered agent whose deadline passed makes no new model call; its time
    does not restart with the delivery."""
    limits(agent_timeout_seconds=1)
    llm.respond = Plan([Agent("slow", ["tasks.search"], [SEARCH, SEARCH])])
    turn = turn_start(conversation=conversation_for(alice), text="go")
    queued(1)  # the orchestrator dispatches and waits; the agent is queued
    slow = AgentDispatch.objects.get(turn=turn)
    # An earlier delivery started it 5 s ago and died (the reaper handed it back).
    AgentDispatch.objects.filter(pk=slow.pk).update(started_at=timezone.now() - timedelta(seconds=5),
                                                    deadline_at=timezone.now() - timedelta(seconds=4))
    queued()
    slow.refresh_from_db()
    assert slow.outcome == "timeout" and "wall-clock limit of 1s" in slow.error
    assert requests_of(llm, "slow") == []
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error


def test_continue_moves_the_agents_deadlines_on_by_the_pause(llm, run_turn, limits, alice):
    limits(turn_max_skill_calls=1, agent_timeout_seconds=60)
    llm.respond = Plan([Agent("maker", ["tasks.create"], [("tasks.create", {"title": "one"}),
                                                          ("tasks.create", {"title": "two"})])])
    turn = run_turn()
    assert turn.status == "paused"
    maker = AgentDispatch.objects.get(turn=turn)
    pause = TurnPause.objects.get(turn=turn)
    # The owner took ten minutes to answer.
    TurnPause.objects.filter(pk=pause.pk).update(tripped_at=pause.tripped_at - timedelta(minutes=10))
    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    after = AgentDispatch.objects.get(pk=maker.pk)
    assert 600 <= (after.deadline_at - maker.deadline_at).total_seconds() < 660
    assert turn.status == "completed", turn.error
    assert after.outcome == "completed"


# --- nested skill calls: the same grant check and budgets --------------------------------


@pytest.fixture
def digest_skill(monkeypatch):
    """testing.digest: a handler that calls tasks.search itself (a nested execution)."""

    def digest(user):
        found = execute_skill(name="tasks.search", arguments={"status": "open"}, user=user,
                              tool_call_id="digest/search")
        return {"searched": found.ok, "error": found.error}

    skill = Skill(name="testing.digest", description="Digest my tasks.",
                  parameters={"type": "object", "properties": {}, "additionalProperties": False}, handler=digest)
    monkeypatch.setitem(registry.DOMAINS, "testing", Domain(name="testing", description="Tests.", skills=(skill,)))


def test_a_nested_skill_outside_the_grant_is_refused(llm, run_turn, digest_skill):
    llm.respond = Plan([Agent("d", ["testing.digest"], [("testing.digest", {})])])
    turn = run_turn()
    nested = SkillExecution.objects.get(skill="tasks.search")
    assert (nested.status, nested.result["error_kind"], nested.parent.skill) == ("failed", "not_granted",
                                                                                "testing.digest")
    assert SkillExecution.objects.get(skill="testing.digest").result == {"searched": False, "error": nested.error}
    finished = Event.objects.filter(turn=turn, type="skill.finished").values_list("payload__skill", flat=True)
    assert sorted(finished) == ["tasks.search", "testing.digest"]


def test_a_nested_skill_counts_against_the_turns_budget(llm, run_turn, digest_skill, limits, alice):
    limits(turn_max_skill_calls=1)
    llm.respond = Plan([Agent("d", ["testing.digest", "tasks.search"], [("testing.digest", {})])])
    turn = run_turn()
    assert turn.status == "paused"
    assert TurnPause.objects.get(turn=turn).limit == "turn_max_skill_calls"
    assert list(SkillExecution.objects.values_list("skill", "status")) == [("testing.digest", "running")]
    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert turn.skill_calls == 2
    assert SkillExecution.objects.get(skill="testing.digest").result == {"searched": True, "error": ""}
    assert Event.objects.filter(turn=turn, type="skill.started").count() == 2


# --- a turn that ends closes every agent --------------------------------------------------


def test_stop_closes_agents_that_finished_but_were_never_read(llm, queued, alice):
    llm.respond = Plan([Agent("early", ["tasks.search"], [SEARCH]), Agent("late", ["tasks.search"], [SEARCH])])
    turn = turn_start(conversation=conversation_for(alice), text="go")
    queued(2)  # the orchestrator dispatches and waits; `early` runs; `late` is still queued
    early = AgentDispatch.objects.get(turn=turn, agent_id="early")
    assert early.state == "waiting_for_merge"
    turn_stop(turn=turn, user=alice)
    queued()

    early.refresh_from_db()
    late = AgentDispatch.objects.get(turn=turn, agent_id="late")
    assert (early.state, early.outcome, early.close_reason) == ("closed", "completed",
                                                                "not merged: stopped by the owner")
    assert (late.state, late.outcome) == ("closed", "cancelled")
    closed = Event.objects.get(dispatch=early, type="agent.subagent_closed")
    assert closed.payload["final_status"] == "completed"


def test_a_failed_turn_closes_every_agent(llm, run_turn):
    plan = Plan([Agent("ok", ["tasks.search"], [SEARCH]), Agent("bad", ["tasks.search"], [SEARCH])])

    def respond(request):
        if is_agent(request, "bad"):
            return http_error(400, "no")
        if is_orchestrator(request) and tool_results_in(request) == 3:  # after get_skill and 2 dispatches
            return http_error(401, "key revoked")  # permanent: the turn fails
        return plan(request)

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "failed"
    agents = {d.agent_id: d for d in AgentDispatch.objects.filter(turn=turn)}
    assert {(d.state, d.outcome) for d in agents.values()} == {("closed", "completed"), ("closed", "failed")}
    assert agents["ok"].close_reason == "not merged: the turn failed"
    assert agents["bad"].close_reason == "failed; not read: the turn failed"


def test_skipped_and_cancelled_agents_show_as_such_in_the_audit(llm, queued, alice, client):
    def respond(request):
        if is_agent(request, "root"):
            return http_error(400, "no")
        return orchestrator_script([dispatch_spec("root"), dispatch_spec("leaf", ["root"]), dispatch_spec("slow")])(
            request)

    llm.respond = respond
    turn = turn_start(conversation=conversation_for(alice), text="go")
    queued(2)  # the orchestrator dispatches and waits; root fails and leaf is skipped; slow is still queued
    turn_stop(turn=turn, user=alice)
    agents = {d.agent_id: d for d in AgentDispatch.objects.filter(turn=turn)}
    assert {x: (d.state, d.outcome) for x, d in agents.items()} == {
        "root": ("closed", "failed"), "leaf": ("closed", "skipped"), "slow": ("closed", "cancelled")}

    client.force_login(alice)
    page = client.get(reverse("conversation_audit", args=[turn.conversation_id])).content.decode()
    for agent_id, shown, reason in [("leaf", "skipped", "dependency root failed"),
                                    ("slow", "cancelled", "cancelled: stopped by the owner")]:
        row = page.split(f'id="audit-dispatch-{agents[agent_id].pk}"', 1)[1].split("</li>", 1)[0]
        assert f'class="state state-{shown}">{shown}<' in row and reason in row, row
    export = client.get(reverse("conversation_export", args=[turn.conversation_id])).json()
    outcomes = {d["agent_id"]: (d["state"], d["outcome"]) for d in export["turns"][0]["dispatches"]}
    assert outcomes["leaf"] == ("closed", "skipped") and outcomes["slow"] == ("closed", "cancelled")
