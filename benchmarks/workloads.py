"""The benchmark's workloads: DAGs of scripted agents, and the bound on their makespan.

Every agent makes its skill calls one per LLM response, then reports: (calls + 1) LLM
calls. The orchestrator makes 4 (get_skill, dispatch all, get_agent_results, answer),
but its get_agent_results call runs while the agents work: only 3 are on the path. The
bound is those 3 · L plus the DAG's critical path, each agent costing (calls + 1) · L
plus the time its skill calls took: no engine can finish the turn sooner.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.llm_server import Agent, Plan

ORCHESTRATOR_CALLS = 4
ORCHESTRATOR_CALLS_ON_THE_PATH = 3  # get_agent_results overlaps the agents
SKILL = ("tasks.search", {"status": "open"})


def _agent(agent_id: str, calls: int = 2, depends_on: list[str] | None = None) -> Agent:
    return Agent(agent_id, ["tasks.search"], [SKILL] * calls, depends_on=depends_on or [],
                 report=f"{agent_id}: done")


@dataclass(frozen=True)
class Workload:
    name: str
    agents: tuple[Agent, ...]
    conversations: int = 1  # `load` runs this many turns at once, one user each

    def plan(self) -> Plan:
        return Plan(list(self.agents), answer=f"{self.name} done.", tag_missions=True)

    @property
    def expected_llm_requests(self) -> int:
        per_turn = ORCHESTRATOR_CALLS + sum(len(a.calls) + 1 for a in self.agents)
        return per_turn * self.conversations

    def bound_seconds(self, latency: float, skill_seconds: dict[str, float]) -> float:
        """The orchestrator's calls on the path plus the critical path (the longest chain
        of agent costs)."""
        cost = {a.agent_id: (len(a.calls) + 1) * latency + skill_seconds.get(a.agent_id, 0.0) for a in self.agents}
        finish: dict[str, float] = {}
        for agent in self.agents:  # agents are listed after their dependencies
            finish[agent.agent_id] = max((finish[d] for d in agent.depends_on), default=0.0) + cost[agent.agent_id]
        return ORCHESTRATOR_CALLS_ON_THE_PATH * latency + max(finish.values())


def wide(agents: int = 8) -> Workload:
    return Workload("wide", tuple(_agent(f"w{i}") for i in range(agents)))


WORKLOADS = {
    "wide": wide(),
    "diamond": Workload("diamond", (
        _agent("a"), _agent("b"), _agent("c", depends_on=["a", "b"]), _agent("d", depends_on=["c"]))),
    "chain": Workload("chain", tuple(
        _agent(f"s{i}", depends_on=[f"s{i - 1}"] if i else []) for i in range(4))),
    "load": Workload("load", wide().agents, conversations=20),
}
