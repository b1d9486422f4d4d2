"""Any batch ends (issue 13): hypothesis sends random dispatch_agent batches.

The orchestrator sends one or two batches drawn at random — agent ids from a small
alphabet, so duplicates happen; dependencies on anything, so self-loops, cycles (several
per batch), unknown ids, dependents of refused agents and, in the second batch, agents
of the first that failed or were skipped; now and then an unknown skill — then asks for
the results and answers. Each agent reports, or fails (a permanent provider error).

Whatever was drawn, the turn must end, which with inline tasks means: `run_turn`
returns a completed turn (an agent left waiting for something that cannot happen would
leave it `waiting`). Every agent was either refused with an error, or ran, or was
skipped with a reason naming a dependency; none had to be cancelled because the turn
ended first; and every agent ran only after all its dependencies completed.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestration.models import AgentDispatch
from tests.support.llm_server import Reply, agent_of, calls, http_error, text

pytestmark = pytest.mark.django_db(transaction=True)

IDS = ["a", "b", "c", "d", "e"]


def specs(ids: list[str]):
    return st.fixed_dictionaries(
        {
            "agent_id": st.sampled_from(ids),
            "mission": st.just("m"),
            "skills": st.sampled_from([["tasks.search"]] * 9 + [["tasks.explode"]]),
            "depends_on": st.lists(st.sampled_from(ids + ["ghost"]), max_size=3, unique=True),
        }
    ).map(lambda spec: {**spec, "mission": f"mission:{spec['agent_id']}"})


batches = st.lists(st.lists(specs(IDS), min_size=1, max_size=6), min_size=1, max_size=2)
failing = st.sets(st.sampled_from(IDS))


def script(batches: list[list[dict]], failing: set[str]):
    def respond(request: dict) -> Reply:
        names = {tool["function"]["name"] for tool in request.get("tools", [])}
        if "use_skill" in names:
            agent_id = agent_of(request)
            return http_error(400, "scripted failure") if agent_id in failing else text(f"{agent_id} reports")
        sent = sum(1 for m in request["messages"] if m["role"] == "assistant")
        if sent < len(batches):
            return calls(*[("dispatch_agent", spec) for spec in batches[sent]])
        if sent == len(batches):
            return calls(("get_agent_results", {}))
        return text("done")

    return respond


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batches=batches, failing=failing)
def test_any_batch_ends(llm, run_turn, settings_, batches, failing):
    llm.respond = script(batches, failing)
    turn = run_turn()

    assert turn.status == "completed", (turn.status, turn.error, batches)
    dispatches = {d.agent_id: d for d in AgentDispatch.objects.filter(turn=turn)}
    for dispatch in dispatches.values():
        assert dispatch.state == "closed", (dispatch.agent_id, dispatch.state)
        assert dispatch.outcome in ("completed", "failed", "skipped"), (dispatch.agent_id, dispatch.outcome)
        deps = [dispatches[dep] for dep in dispatch.depends_on]
        if dispatch.outcome == "skipped":
            assert dispatch.started_at is None and dispatch.close_reason.startswith("dependency ")
            assert any(dep.outcome != "completed" for dep in deps)
        else:
            assert all(dep.outcome == "completed" and dep.finished_at <= dispatch.started_at for dep in deps)
    # what the orchestrator was told: each call answered, dispatched or refused with a reason
    answered = [json.loads(m.content) for m in turn.messages.filter(role="tool").order_by("seq")]
    dispatch_answers = answered[:-1]
    assert len(dispatch_answers) == sum(len(batch) for batch in batches)
    assert all(a.get("status") == "dispatched" or a.get("error") for a in dispatch_answers)
    assert sorted(a["agent_id"] for a in dispatch_answers if a.get("status") == "dispatched") == sorted(dispatches)
    reported = {agent["agent_id"]: agent["status"] for agent in answered[-1]["agents"]}
    assert reported == {agent_id: d.outcome for agent_id, d in dispatches.items()}


@pytest.fixture
def settings_(settings):
    """Room for every agent the batches can create: this is about graphs, not limits."""
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_agents": 20}
    return settings
