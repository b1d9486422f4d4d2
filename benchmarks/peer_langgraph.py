"""The durable peer: the bench's turn as a LangGraph graph with its PostgreSQL checkpointer.

The same scripted model server answers it (its requests are shaped like ours: the
orchestrator's tools, agents' `use_skill` and missions), so the peer makes exactly the
same model calls in the same order, and the same bound applies. Every super-step is
checkpointed before the next begins (`durability="sync"`): durable like this project,
which stores every step. The orchestrator and every agent step are nodes; a `schedule`
node after each super-step sends the agents that can take a step (their dependencies
reported) and the orchestrator when it has a call to make — its get_agent_results call
runs beside the agents' first steps, as ours does. A skill call answers at once (ours
reads the task table): the peer is not charged for skills.

Bench-only (`pip install -e '.[bench]'`): nothing in the product imports LangGraph.
"""

from __future__ import annotations

import asyncio
import json
import operator
import resource
import subprocess
import sys
import time
import uuid
from typing import Annotated, TypedDict

from benchmarks.load import services_cpu
from benchmarks.workloads import Workload
from tests.support.llm_server import ScriptedLLM

ORCHESTRATOR_TOOLS = [
    {"type": "function", "function": {"name": name, "description": name,
                                      "parameters": {"type": "object", "properties": {}}}}
    for name in ("get_skill", "dispatch_agent", "get_agent_results")
]
USE_SKILL = {"type": "function", "function": {"name": "use_skill", "description": "use a skill",
                                              "parameters": {"type": "object", "properties": {}}}}


def _merge(left: dict, right: dict) -> dict:
    return {**left, **right}


class TurnState(TypedDict, total=False):
    orchestrator: list[dict]
    call_orchestrator: bool  # it has a call to make in the next super-step
    waiting: bool  # its get_agent_results waits for the agents
    agents: Annotated[dict, _merge]  # agent id → {"messages", "deps", "done", "report"}
    answer: str
    calls: Annotated[int, operator.add]


def _message(choice) -> dict:
    message = {"role": "assistant", "content": choice.message.content or ""}
    if choice.message.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in choice.message.tool_calls]
    return message


def build_graph(client, model: str):
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    async def orchestrate(state: TurnState) -> dict:
        messages = list(state["orchestrator"])
        response = await client.chat.completions.create(model=model, messages=messages, tools=ORCHESTRATOR_TOOLS)
        message = _message(response.choices[0])
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return {"orchestrator": messages, "answer": message["content"], "call_orchestrator": False, "calls": 1}
        update: dict = {"calls": 1, "call_orchestrator": True}
        agents = {}
        for call in calls:
            name = call["function"]["name"]
            if name == "get_agent_results":
                update.update(waiting=True, call_orchestrator=False)
                continue
            content = '{"ok": true}'
            if name == "dispatch_agent":
                spec = json.loads(call["function"]["arguments"])
                agents[spec["agent_id"]] = {
                    "messages": [{"role": "system", "content": "You are a focused sub-agent."},
                                 {"role": "user", "content": spec["mission"]}],
                    "deps": spec.get("depends_on", []), "done": False, "report": ""}
                content = json.dumps({"status": "dispatched", "agent_id": spec["agent_id"]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return {**update, "orchestrator": messages, "agents": agents}

    async def agent_step(task: dict) -> dict:
        agent_id, agent = task["agent_id"], task["agent"]
        messages = list(agent["messages"])
        response = await client.chat.completions.create(model=model, messages=messages, tools=[USE_SKILL])
        message = _message(response.choices[0])
        messages.append(message)
        calls = message.get("tool_calls") or []
        for call in calls:  # the skill answers at once
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": '{"ok": true, "result": {"tasks": [], "count": 0}}'})
        done = not calls
        return {"agents": {agent_id: {**agent, "messages": messages, "done": done,
                                      "report": message["content"] if done else ""}}, "calls": 1}

    def schedule(state: TurnState) -> dict:
        agents = state.get("agents") or {}
        if state.get("waiting") and agents and all(a["done"] for a in agents.values()):
            messages = list(state["orchestrator"])
            call_id = messages[-1]["tool_calls"][0]["id"]
            results = {agent_id: a["report"] for agent_id, a in agents.items()}
            messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(results)})
            return {"orchestrator": messages, "waiting": False, "call_orchestrator": True}
        return {}

    def route(state: TurnState):
        if state.get("answer"):
            return END
        agents = state.get("agents") or {}
        sends: list = [Send("agent_step", {"agent_id": agent_id, "agent": agent}) for agent_id, agent in agents.items()
                       if not agent["done"] and all(agents[d]["done"] for d in agent["deps"])]
        if state.get("call_orchestrator"):
            sends.append("orchestrate")
        return sends or END

    graph = StateGraph(TurnState)
    graph.add_node("orchestrate", orchestrate)
    graph.add_node("agent_step", agent_step)
    graph.add_node("schedule", schedule)
    graph.add_edge(START, "orchestrate")
    graph.add_edge("orchestrate", "schedule")
    graph.add_edge("agent_step", "schedule")
    graph.add_conditional_edges("schedule", route)
    return graph


def run_peer(*, workload: Workload, latency_ms: int, server: ScriptedLLM, database_url: str) -> dict:
    """One run of `workload` (its `conversations` turns at once) through the durable graph,
    in a process of its own (its CPU is the peer's alone, not the model server's):
    makespan, ratio to the bound, client CPU and PostgreSQL CPU per model call."""
    server.respond, server.latency = workload.plan(), latency_ms / 1000
    requests_before = len(server.requests)
    services_before = services_cpu()
    done = subprocess.run([sys.executable, "-m", "benchmarks.peer_langgraph", workload.name, server.url, database_url],
                          capture_output=True, text=True, check=False, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the durable peer failed:\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    calls = len(server.requests) - requests_before - run["warm_up_calls"]
    bound = workload.bound_seconds(latency_ms / 1000, {})
    postgres = services_cpu().get("postgres", 0.0) - services_before.get("postgres", 0.0)  # with the warm-up's
    return {"peer": "langgraph+postgres", "workload": workload.name, "latency_ms": latency_ms,
            "turns": workload.conversations, "makespan_s": round(run["makespan_s"], 3), "bound_s": round(bound, 3),
            "ratio": round(run["makespan_s"] / bound, 2), "turn_p50_s": round(run["turn_p50_s"], 3),
            "llm_requests": calls, "cpu_ms_per_call": round(run["cpu_s"] * 1000 / max(calls, 1), 1),
            "pg_ms_per_call": round(postgres * 1000 / max(calls + run["warm_up_calls"], 1), 1)}


async def _run(workload: Workload, server_url: str, database_url: str) -> dict:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server_url, api_key="bench", max_retries=0)
    async with AsyncPostgresSaver.from_conn_string(database_url) as saver:
        await saver.setup()
        graph = build_graph(client, "gpt-4o-mini").compile(checkpointer=saver)
        warm_up = await _turn(graph, workload, "warm-up")  # connections, first compiles
        cpu_before = _cpu()
        started = time.monotonic()
        turns = await asyncio.gather(*[_turn(graph, workload, f"user-{i}") for i in range(workload.conversations)])
        makespan = time.monotonic() - started
        cpu = _cpu() - cpu_before
    await client.close()
    spans = sorted(span for span, _ in turns)
    return {"makespan_s": makespan, "turn_p50_s": spans[len(spans) // 2], "cpu_s": cpu, "warm_up_calls": warm_up[1]}


async def _turn(graph, workload: Workload, asked: str) -> tuple[float, int]:
    """(seconds, model calls) of one turn."""
    started = time.monotonic()
    state = await graph.ainvoke(
        {"orchestrator": [{"role": "system", "content": "You are the orchestrator."},
                          {"role": "user", "content": f"{asked} {uuid.uuid4().hex[:6]}"}],
         "agents": {}, "calls": 0},
        config={"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 200},
        durability="sync")
    assert state.get("answer"), state
    return time.monotonic() - started, state["calls"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":  # run_peer's child: WORKLOAD SERVER_URL DATABASE_URL → one JSON line
    from benchmarks.workloads import WORKLOADS

    print(json.dumps(asyncio.run(_run(WORKLOADS[sys.argv[1]], sys.argv[2], sys.argv[3]))))
