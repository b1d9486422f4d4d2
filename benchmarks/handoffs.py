"""Hand-off latencies, read from the scripted model server's timeline (issue 14).

A hand-off is the time the engine takes between one model answer (or the turn's start)
and the next model request that had to wait for it: no model is waiting then, only the
engine. Each is measured per turn, from when the server sent the answer to when the next
request arrived, so the database, the queue, the runner and the SDK are all inside it.

- start → first request: the turn started (its row) → the orchestrator's first request;
- dispatch → agents: the orchestrator's `dispatch_agent` answer → each agent with no
  dependency's first request;
- agent step: an agent's answer → its next request, less its skill call (its mean);
- dependency → dependent: the last dependency's last answer → the dependent's first request;
- agents → orchestrator: the last agent's last answer → the orchestrator's next request.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from benchmarks.workloads import Workload
from tests.support.llm_server import ScriptedLLM, agent_of, asked_of, user_text

HANDOFFS = ("start → first request", "dispatch → agents", "agent step", "dependency → dependent",
            "agents → orchestrator")


@dataclass
class _Call:
    arrived: float
    answered: float
    called_before: set[str] = field(default_factory=set)  # tools called earlier in its messages


@dataclass
class _TurnCalls:
    orchestrator: list[_Call] = field(default_factory=list)
    agents: dict[str, list[_Call]] = field(default_factory=lambda: defaultdict(list))


def handoff_seconds(server: ScriptedLLM, since: int, workload: Workload,
                    turns: dict[str, tuple[float, dict[str, float]]]) -> dict[str, list[float]]:
    """Every hand-off of the turns, by kind. `turns`: the user's text → (the turn's start,
    epoch seconds; each agent's total skill seconds). `since`: the first request index."""
    calls = _calls_by_turn(server, since)
    found: dict[str, list[float]] = {name: [] for name in HANDOFFS}
    for asked, (started, skill_seconds) in turns.items():
        turn = calls.get(asked)
        if turn is None or not turn.orchestrator:
            continue
        found["start → first request"].append(turn.orchestrator[0].arrived - started)
        # The answer that dispatched is the one before the first request that shows it.
        after = next((i for i, c in enumerate(turn.orchestrator) if "dispatch_agent" in c.called_before), 0)
        dispatched = turn.orchestrator[after - 1] if after else None
        last_answers = {agent_id: agent_calls[-1].answered for agent_id, agent_calls in turn.agents.items()}
        for agent in workload.agents:
            agent_calls = turn.agents.get(agent.agent_id)
            if not agent_calls:
                continue
            if not agent.depends_on and dispatched is not None:
                found["dispatch → agents"].append(agent_calls[0].arrived - dispatched.answered)
            elif agent.depends_on and all(d in last_answers for d in agent.depends_on):
                ready = max(last_answers[d] for d in agent.depends_on)
                found["dependency → dependent"].append(agent_calls[0].arrived - ready)
            skill = skill_seconds.get(agent.agent_id, 0.0) / max(len(agent.calls), 1)
            found["agent step"].extend(
                later.arrived - earlier.answered - skill for earlier, later in zip(agent_calls, agent_calls[1:]))
        if last_answers:
            done = max(last_answers.values())
            following = [c.arrived for c in turn.orchestrator if c.arrived >= done]
            if following:
                found["agents → orchestrator"].append(min(following) - done)
    return found


def _calls_by_turn(server: ScriptedLLM, since: int) -> dict[str, _TurnCalls]:
    by_turn: dict[str, _TurnCalls] = defaultdict(_TurnCalls)
    for index, arrived, answered in sorted(server.timeline, key=lambda entry: entry[1]):
        if index < since:
            continue
        request = server.requests[index]
        if "use_skill" in {t["function"]["name"] for t in request.get("tools", [])}:
            by_turn[asked_of(request)].agents[agent_of(request)].append(_Call(arrived, answered))
        else:
            called = {c["function"]["name"] for m in request["messages"] if m["role"] == "assistant"
                      for c in m.get("tool_calls") or []}
            by_turn[user_text(request)].orchestrator.append(_Call(arrived, answered, called))
    return by_turn
