"""Nested delegation (DESIGN.md §6): a delegating profile's agents dispatch their own."""

from __future__ import annotations

import json

import pytest

from orchestration.models import AgentDispatch, AgentProfile, Event, TurnPause
from orchestration.questions.pauses import turn_continue
from orchestration.lifecycle.turns import turn_start
from skills.domains.tasks.models import Task
from tests.factories import conversation_for
from tests.support.llm_server import Reply, agent_of, calls, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.replayed]


@pytest.fixture(autouse=True)
def scripted_ids(llm):
    """These tests look answers up by the tool-call ids they scripted; the engine's
    handling of providers' fresh and reused ids is tested in test_engine.py."""
    llm.ids = "scripted"

AGENT_EVENTS = ["agent.subagent_created", "agent.subagent_started", "agent.subagent_waiting_for_merge",
                "agent.subagent_closed"]


@pytest.fixture
def lead_profile(db):
    return AgentProfile.objects.create(
        name="lead", description="Splits work among helpers.", system_prompt="You lead a small team.",
        may_delegate=True, max_tool_calls=5,
    )


def tool_names(request: dict) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


def last_tool(request: dict) -> str:
    return [m for m in request["messages"] if m["role"] == "tool"][-1]["content"]


def script(orchestrator: list, agents: dict[str, list]):
    """Step n of a script answers the request that has n assistant messages so far.
    A step is a Reply or a function of the request."""

    def respond(request: dict) -> Reply:
        steps = agents[agent_of(request)] if "use_skill" in tool_names(request) else orchestrator
        done = sum(1 for m in request["messages"] if m["role"] == "assistant")
        step = steps[min(done, len(steps) - 1)]
        return step(request) if callable(step) else step

    return respond


def dispatch_call(agent_id: str, skills: list[str], prefix: str, **extra) -> Reply:
    spec = {"agent_id": agent_id, "mission": f"mission:{agent_id}", "skills": skills, **extra}
    return calls(("dispatch_agent", spec), prefix=prefix)


def results_call(prefix: str, **arguments) -> Reply:
    return calls(("get_agent_results", arguments), prefix=prefix)


def skill_call(prefix: str, skill: str, arguments: dict) -> Reply:
    return calls(("use_skill", {"skill": skill, "arguments": arguments}), prefix=prefix)


def saw(request: dict) -> Reply:
    return text("Saw: " + last_tool(request))


def orchestrator_for_lead(skills: list[str]) -> list:
    return [dispatch_call("lead", skills, "o1", profile="lead"), results_call("o2"), saw]


def requests_of(llm, agent_id: str) -> list[dict]:
    return [r for r in llm.requests if "use_skill" in tool_names(r) and agent_of(r) == agent_id]


def agent_events(dispatch: AgentDispatch) -> list[str]:
    return list(Event.objects.filter(dispatch=dispatch, type__startswith="agent.subagent_").order_by("id")
                .values_list("type", flat=True))


def answer(turn) -> str:
    """The model's answer, or (none: stopped, failed) the engine's last notice; the engine's
    record of side effects follows an answer and is not it."""
    message = (turn.messages.filter(role="assistant", tool_calls=[]).order_by("-seq").first()
               or turn.messages.filter(role="notice").order_by("-seq").first())
    return message.content


def test_delegating_agent_dispatches_a_child_and_reports_its_result(llm, run_turn, lead_profile):
    llm.respond = script(
        orchestrator=[dispatch_call("lead", ["tasks.create", "tasks.search"], "o1", profile="lead"),
                      results_call("o2"), results_call("o3", agent_ids=["helper"]), saw],
        agents={
            "lead": [dispatch_call("helper", ["tasks.create"], "l1"), results_call("l2"), saw],
            "helper": [skill_call("h1", "tasks.create", {"title": "from helper"}), text("helper made a task")],
        },
    )
    turn = run_turn()
    assert turn.status == "completed", turn.error
    lead = AgentDispatch.objects.get(agent_id="lead")
    helper = AgentDispatch.objects.get(agent_id="helper")
    assert (helper.parent, helper.depth, helper.turn) == (lead, 2, turn)
    assert helper.state == lead.state == "closed" and helper.outcome == lead.outcome == "completed"
    assert list(Task.objects.values_list("title", flat=True)) == ["from helper"]
    # the child's result reached its parent, and through the parent's report the user
    lead_results = json.loads(next(m["content"] for m in lead.transcript if m.get("tool_call_id") == "l2_0"))
    assert lead_results["agents"][0]["agent_id"] == "helper"
    assert lead_results["agents"][0]["result"] == "helper made a task"
    assert "helper made a task" in lead.result
    orchestrator_results = [json.loads(turn.messages.get(tool_call_id=i).content) for i in ("o2_0", "o3_0")]
    assert [a["agent_id"] for a in orchestrator_results[0]["agents"]] == ["lead"]
    assert orchestrator_results[1] == {"agents": [{"agent_id": "helper", "status": "not_found"}]}
    # a nested agent is an agent like any other in the timeline, linked to its parent
    assert agent_events(helper) == AGENT_EVENTS
    created = Event.objects.get(dispatch=helper, type="agent.subagent_created")
    assert created.payload["parent"] == "lead" and created.payload["depth"] == 2
    assert helper.contract["parent"]["agent_id"] == "lead"
    assert helper.contract["permissions"]["can_spawn_children"] is False
    # tools: the delegating agent has all three, its child at the depth limit only use_skill
    assert tool_names(requests_of(llm, "lead")[0]) == {"use_skill", "dispatch_agent", "get_agent_results"}
    assert tool_names(requests_of(llm, "helper")[0]) == {"use_skill"}
    assert "You may delegate" in requests_of(llm, "lead")[0]["messages"][0]["content"]
    assert turn.agents_dispatched == 2 and turn.skill_calls == 1
    assert llm.errors == []


def test_agents_depend_only_on_their_siblings(llm, run_turn, lead_profile):
    """The orchestrator cannot make its agent wait on someone's child, nor a child on its
    parent (which would wait for it in turn); agent_ids stay unique in the whole turn."""
    llm.respond = script(
        orchestrator=[dispatch_call("lead", ["tasks.search"], "o1", profile="lead"), results_call("o2"),
                      calls(("dispatch_agent", {"agent_id": "x", "mission": "mission:x", "skills": ["tasks.search"],
                                                "depends_on": ["helper"]}),
                            ("dispatch_agent", {"agent_id": "helper", "mission": "mission:helper",
                                                "skills": ["tasks.search"]}), prefix="o3"),
                      saw],
        agents={
            "lead": [calls(("dispatch_agent", {"agent_id": "helper", "mission": "mission:helper",
                                               "skills": ["tasks.search"]}),
                           ("dispatch_agent", {"agent_id": "loop", "mission": "mission:loop",
                                               "skills": ["tasks.search"], "depends_on": ["lead"]}), prefix="l1"),
                     results_call("l2"), saw],
            "helper": [text("helper done")],
        },
    )
    turn = run_turn()
    assert turn.status == "completed", turn.error
    lead = AgentDispatch.objects.get(agent_id="lead")
    assert "depends_on names unknown agents ['lead']" in json.dumps(lead.transcript)
    refusals = [json.loads(turn.messages.get(tool_call_id=f"o3_{i}").content) for i in (0, 1)]
    assert "depends_on names unknown agents ['helper']" in refusals[0]["error"]
    assert "already used in this turn" in refusals[1]["error"]
    assert sorted(AgentDispatch.objects.values_list("agent_id", flat=True)) == ["helper", "lead"]


def test_child_granted_a_skill_outside_the_parents_grant_is_refused(llm, run_turn, lead_profile):
    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.search"]),
        agents={"lead": [dispatch_call("helper", ["tasks.search", "email.send"], "l1"), saw]},
    )
    turn = run_turn()
    assert turn.status == "completed", turn.error
    lead = AgentDispatch.objects.get(agent_id="lead")
    assert "a nested agent may only get a subset of its parent's skills" in lead.result
    assert "email.send" in lead.result
    assert not AgentDispatch.objects.filter(agent_id="helper").exists()
    assert turn.agents_dispatched == 1


def test_third_level_is_refused(llm, run_turn, lead_profile):
    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.search"]),
        agents={
            "lead": [dispatch_call("mid", ["tasks.search"], "l1", profile="lead"), results_call("l2"), saw],
            "mid": [dispatch_call("deep", ["tasks.search"], "m1"), saw],
        },
    )
    turn = run_turn()
    assert turn.status == "completed", turn.error
    mid = AgentDispatch.objects.get(agent_id="mid")
    assert mid.depth == 2 and mid.profile_name == "lead"
    assert tool_names(requests_of(llm, "mid")[0]) == {"use_skill"}  # not offered...
    assert "nested delegation is limited to depth 2" in mid.result  # ...and refused when called
    assert not AgentDispatch.objects.filter(agent_id="deep").exists()
    assert not AgentDispatch.objects.filter(depth__gt=2).exists()


def test_a_non_delegating_profile_has_no_dispatch_tool(llm, run_turn):
    llm.respond = script(
        orchestrator=[calls(("dispatch_agent", {"agent_id": "plain", "mission": "mission:plain", "skills": ["tasks.search"]}),
                            ("dispatch_agent", {"agent_id": "exec", "mission": "mission:exec", "skills": ["tasks.search"],
                                                "profile": "executor"}), prefix="o1"),
                      results_call("o2"), saw],
        agents={name: [dispatch_call("child", ["tasks.search"], f"{name}1"), saw] for name in ("plain", "exec")},
    )
    turn = run_turn()
    assert turn.status == "completed", turn.error
    for name in ("plain", "exec"):
        assert tool_names(requests_of(llm, name)[0]) == {"use_skill"}
        assert "You may delegate" not in requests_of(llm, name)[0]["messages"][0]["content"]
        assert "may not dispatch agents" in AgentDispatch.objects.get(agent_id=name).result
    assert not AgentDispatch.objects.filter(agent_id="child").exists()


def test_limits_count_the_whole_tree(llm, run_turn, lead_profile, settings, alice):
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_agents": 2}
    create = [skill_call("h1", "tasks.create", {"title": "t"}), text("made one")]
    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.create"]),
        agents={
            "lead": [calls(("dispatch_agent", {"agent_id": "h1", "mission": "mission:h1", "skills": ["tasks.create"]}),
                           ("dispatch_agent", {"agent_id": "h2", "mission": "mission:h2", "skills": ["tasks.create"]}),
                           prefix="l1"),
                     results_call("l2"), saw],
            "h1": create, "h2": create,
        },
    )
    turn = run_turn()
    # the lead's two children would make three agents: the turn pauses before either exists
    assert turn.status == "paused"
    pause = TurnPause.objects.get(turn=turn)
    assert pause.limit == "turn_max_agents" and pause.detail["requested"] == 2
    assert not AgentDispatch.objects.filter(parent__isnull=False).exists()
    assert AgentDispatch.objects.get(agent_id="lead").state == "created"  # resumes on Continue

    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert turn.agents_dispatched == 3
    assert AgentDispatch.objects.filter(parent__agent_id="lead", outcome="completed").count() == 2
    assert Task.objects.count() == 2 and turn.skill_calls == 2  # children's calls count for the turn
    assert len(requests_of(llm, "lead")) == 3  # the replay did not ask the model again


def test_children_share_the_turns_skill_call_limit(llm, run_turn, lead_profile, settings, alice):
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_skill_calls": 2}
    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.create"]),
        agents={
            "lead": [skill_call("l0", "tasks.create", {"title": "lead's"}), dispatch_call("h", ["tasks.create"], "l1"),
                     results_call("l2"), saw],
            "h": [skill_call("h1", "tasks.create", {"title": "h's first"}),
                  skill_call("h2", "tasks.create", {"title": "h's second"}), text("done")],
        },
    )
    turn = run_turn()
    assert turn.status == "paused"
    assert TurnPause.objects.get(turn=turn).limit == "turn_max_skill_calls"
    assert sorted(Task.objects.values_list("title", flat=True)) == ["h's first", "lead's"]

    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert sorted(Task.objects.values_list("title", flat=True)) == ["h's first", "h's second", "lead's"]
    lead = AgentDispatch.objects.get(agent_id="lead")
    assert "done" in lead.result and lead.outcome == "completed"
    assert turn.skill_calls == 3


# --- waiting without holding a worker ----------------------------------------------------


def test_parent_waits_in_created_and_its_last_child_wakes_it(llm, queued, alice, lead_profile):
    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.create"]),
        agents={
            "lead": [skill_call("l0", "tasks.create", {"title": "lead's"}), dispatch_call("h", ["tasks.create"], "l1"),
                     results_call("l2"), saw],
            "h": [skill_call("h1", "tasks.create", {"title": "h's"}), text("h made a task")],
        },
    )
    turn = turn_start(conversation=conversation_for(alice), text="go")
    ran = queued()
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    lead = AgentDispatch.objects.get(agent_id="lead")
    # the lead's task ended at get_agent_results; h ran on the free "worker", then woke it
    order = [name for name in ran if name.startswith("subagent_run")]
    h = AgentDispatch.objects.get(agent_id="h")
    assert order == [f"subagent_run({lead.pk},)", f"subagent_run({h.pk},)", f"subagent_run({lead.pk},)"]
    assert agent_events(lead) == [*AGENT_EVENTS[:2], "agent.subagent_attempt", *AGENT_EVENTS[2:]]
    attempt = Event.objects.get(dispatch=lead, type="agent.subagent_attempt")
    assert attempt.payload["reason"] == "its agents finished" and attempt.payload["awaited"] == ["h"]
    # the woken lead replayed its stored steps: no model call and no side effect twice
    assert len(requests_of(llm, "lead")) == 4
    assert sorted(Task.objects.values_list("title", flat=True)) == ["h's", "lead's"]
    assert "h made a task" in lead.result
    assert lead.awaiting == {} and lead.outcome == "completed"


def test_a_parent_that_reports_first_cancels_its_open_children(llm, queued, alice, lead_profile):
    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.create"]),
        agents={
            "lead": [dispatch_call("h", ["tasks.create"], "l1"), text("I left it to h")],
            "h": [skill_call("h1", "tasks.create", {"title": "h's"}), text("done")],
        },
    )
    turn = turn_start(conversation=conversation_for(alice), text="go")
    queued()
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    h = AgentDispatch.objects.get(agent_id="h")
    assert (h.state, h.outcome) == ("closed", "cancelled")
    assert "parent lead finished first" in h.close_reason
    assert agent_events(h) == ["agent.subagent_created", "agent.subagent_closed"]
    assert not Task.objects.exists() and requests_of(llm, "h") == []


def test_reaper_wakes_a_parent_whose_wake_up_was_lost(llm, queued, alice, lead_profile, monkeypatch):
    from orchestration.lifecycle import dispatches
    from orchestration.lifecycle.reaper import reap_expired

    llm.respond = script(
        orchestrator=orchestrator_for_lead(["tasks.create"]),
        agents={
            "lead": [dispatch_call("h", ["tasks.create"], "l1"), results_call("l2"), saw],
            "h": [text("h done")],
        },
    )
    turn = turn_start(conversation=conversation_for(alice), text="go")
    lost = []
    real_enqueue = dispatches.enqueue_subagents

    def lose_the_wake_up(dispatch_ids, **options):
        for dispatch_id in dispatch_ids:
            if AgentDispatch.objects.filter(pk=dispatch_id).exclude(awaiting={}).exists():
                lost.append(dispatch_id)  # the worker died before it reached the queue
            else:
                real_enqueue([dispatch_id], **options)

    monkeypatch.setattr(dispatches, "enqueue_subagents", lose_the_wake_up)
    queued()
    lead = AgentDispatch.objects.get(agent_id="lead")
    assert lost == [lead.pk] and lead.state == "created" and lead.awaiting["agent_ids"] == ["h"]
    monkeypatch.setattr(dispatches, "enqueue_subagents", real_enqueue)
    assert reap_expired()["queued_again"] == 1  # woken and runnable, not queued: the one rule finds it
    queued()
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert "h done" in AgentDispatch.objects.get(agent_id="lead").result


def test_stop_cancels_the_whole_tree(llm, queued, alice, lead_profile):
    from django.db import connection

    from orchestration.lifecycle.turns import turn_stop

    inner = script(
        orchestrator=orchestrator_for_lead(["tasks.create"]),
        agents={
            "lead": [dispatch_call("h", ["tasks.create"], "l1"), results_call("l2"), saw],
            "h": [skill_call("h1", "tasks.create", {"title": "h's"}), text("done")],
        },
    )
    at_stop = []

    def respond(request):
        if "use_skill" in tool_names(request) and agent_of(request) == "h" and not at_stop:
            try:  # Stop while the lead waits for h and h waits for the model
                turn_stop(turn=AgentDispatch.objects.get(agent_id="h").turn, user=alice)
                at_stop.append(len(llm.requests))
            finally:
                connection.close()
        return inner(request)

    llm.respond = respond
    turn = turn_start(conversation=conversation_for(alice), text="go")
    queued()
    turn.refresh_from_db()
    assert turn.status == "stopped"
    for dispatch in AgentDispatch.objects.all():
        assert (dispatch.state, dispatch.outcome) == ("closed", "cancelled"), dispatch.agent_id
    assert not Task.objects.exists()
    assert len(llm.requests) == at_stop[0]
