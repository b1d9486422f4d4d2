"""Nested delegation (DESIGN.md §6): sub-agents that dispatch their own agents.

Off by default. A dispatch whose contract allows spawning (its profile may delegate and
its depth is below `Limits.max_delegation_depth`) sees `dispatch_agent` and
`get_agent_results` besides `use_skill`, with the orchestrator's shapes but scoped to
itself: a child may only be granted a subset of the parent's skills, may only depend on
its siblings, and its result reaches its parent only. Children are ordinary dispatches
of the same turn (`parent` set, `depth = parent.depth + 1`), so they share the turn's
agent and skill-call counters and the scheduler, reaper and cancellation treat them like
any agent. A deeper level is refused with an error result the model can read.

How a parent waits for its children: it does not hold a worker. When its
`get_agent_results` names a child that is not terminal yet, the parent goes back to
`created` with `awaiting` set and its lease released (`WaitForChildren`); the child that
finishes last makes it ready again (`dispatches.dispatch_schedule`, under the turn
lock, so the wake-up cannot be lost between "check" and "wait"), and the reaper re-wakes
a parent whose wake-up died with a worker. The woken parent runs its loop from the start:
its stored LLM responses, skill executions and children are replayed, not redone, until
it reaches the same `get_agent_results` call, which now answers.

The trade-off: a woken parent pays a replay (database reads, no model calls and no side
effects) and an `agent.subagent_attempt` event per wait; its budgets (wall clock, tokens,
tools) run on across the wait. In exchange a tree of waiting parents can never starve the
worker pool: with N workers and N parents waiting, the children still get workers.
(A blocking wait with heartbeats would be simpler, but deadlocks once every worker holds
a waiting parent.) With inline tasks (tests) children run when their dispatch commits,
so a parent usually finds them done and does not wait at all.
"""

from __future__ import annotations

import json

from django.db import transaction

from orchestration import dispatches as lifecycle
from orchestration.budgets.limits import Limits
from orchestration.delegation import (
    dispatch_create,
    dispatch_result_json,
    plan_batch,
    profiles_by_name,
    reserve_agents,
)
from orchestration.leases import LeaseLost, heartbeat
from orchestration.llm import ToolCall
from orchestration.models import AgentDispatch, DispatchState
from orchestration.toolcalls import error_json, parse_arguments
from orchestration.tooldefs import delegation_tools, get_agent_results_parameters


class WaitForChildren(Exception):
    """The agent went back to `created` until its own agents finish; its worker is free."""


def tools_for(dispatch: AgentDispatch, limits: Limits) -> list[dict]:
    return delegation_tools(
        profile_names=list(profiles_by_name()),
        max_tool_calls_cap=limits.agent_max_tool_calls_cap,
        depth=dispatch.depth,
        max_depth=limits.max_delegation_depth,
    )


def refusal(dispatch: AgentDispatch, limits: Limits) -> str:
    """Why this agent may not delegate (it called a tool it was not given)."""
    if dispatch.depth >= limits.max_delegation_depth:
        return (
            f"nested delegation is limited to depth {limits.max_delegation_depth}: "
            f"{dispatch.agent_id} is at depth {dispatch.depth} and cannot dispatch agents. "
            "Do the work yourself with use_skill."
        )
    return f"{dispatch.agent_id} may not dispatch agents (its profile does not delegate); its only tool is use_skill."


def children_dispatch(*, dispatch: AgentDispatch, token: str, calls: list[ToolCall], step: int,
                      outside: list[str]) -> dict[str, str]:
    """Answer one response's dispatch_agent calls, by tool-call id. Each child starts
    with `outside`, the outside content that had reached the parent when its model wrote
    the calls.

    On replay a call that created its child answers "dispatched" again, and a refused
    call gets its stored refusal back, so the parent's history is what it was.
    """
    done = {c.tool_call_id: c for c in dispatch.children.filter(tool_call_id__in=[call.id for call in calls])}
    stored = {m.get("tool_call_id"): m.get("content") for m in dispatch.transcript or [] if m.get("role") == "tool"}
    answers: dict[str, str] = {}
    fresh = []
    for call in calls:
        if call.id in done:
            answers[call.id] = dispatch_result_json(done[call.id].agent_id)
        elif stored.get(call.id):
            answers[call.id] = stored[call.id]
        else:
            fresh.append(call)
    if not fresh:
        return answers
    task_prompt = (dispatch.contract or {}).get("parent", {}).get("task_prompt") or dispatch.mission
    with transaction.atomic():
        turn = lifecycle.lock_turn(dispatch.turn_id)
        heartbeat(AgentDispatch, dispatch.pk, token)
        planned = plan_batch(turn=turn, calls=fresh, parent=dispatch)
        # Children take slots of the turn's agent limit: limits count the whole tree.
        reserve_agents(turn=turn, agent_ids=[item.spec["agent_id"] for item in planned if not item.error])
        for item in planned:
            if item.error:
                answers[item.call.id] = error_json(item.error, agent_id=item.spec.get("agent_id"))
                continue
            dispatch_create(turn=turn, item=item, task_prompt=task_prompt, parent=dispatch, step_idx=step,
                            outside=outside)
            answers[item.call.id] = dispatch_result_json(item.spec["agent_id"])
        lifecycle.dispatch_schedule(turn)
    return answers


def children_results(*, dispatch: AgentDispatch, token: str, call: ToolCall, messages: list[dict]) -> str:
    """The parent's get_agent_results: its children's results, or WaitForChildren.

    Without ids: the children dispatched so far in this run's history (so a replay of an
    earlier call does not see children dispatched later). Other agents are not_found.
    """
    arguments, error = parse_arguments(
        call.arguments, get_agent_results_parameters(default="every helper you dispatched")
    )
    if error:
        return error_json(error)
    dispatched = {c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []}
    with transaction.atomic():
        lifecycle.lock_turn(dispatch.turn_id)
        heartbeat(AgentDispatch, dispatch.pk, token)
        children = list(dispatch.children.all())
        names = arguments.get("agent_ids") or [c.agent_id for c in children if c.tool_call_id in dispatched]
        found = {c.agent_id: c for c in children if c.agent_id in names}
        waiting = any(not lifecycle.is_terminal(c) for c in found.values())
        if waiting:
            released = lifecycle.transition(
                dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.CREATED,
                where={"lease_token": token}, lease_token="", lease_expires_at=None, attempts=0,
                awaiting={"tool_call_id": call.id, "agent_ids": sorted(found)},
            )
            if not released:
                raise LeaseLost(f"AgentDispatch {dispatch.pk}: lease lost")
        else:
            results = lifecycle.dispatch_results_collect(names, found)
    if waiting:
        raise WaitForChildren()
    return json.dumps(results)
