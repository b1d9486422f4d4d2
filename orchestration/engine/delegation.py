"""Turning dispatch_agent calls into dispatches, or into errors the model can act on.

All dispatch_agent calls of one LLM response are validated as a batch, so an agent may
depend on another dispatched in the same response. Whatever graph the model sends, only
agents that can start one day are created: every cycle is refused (graphlib finds them,
one at a time), and so is every agent that depends, directly or not, on one refused in
the same batch or on an agent that already ended without success.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter

from django.conf import settings

from orchestration.budgets.limits import Limits, LimitTripped
from orchestration.engine.toolcalls import parse_arguments
from orchestration.engine.tooldefs import dispatch_agent_parameters
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.llm import ToolCall
from orchestration.llm.offline import OFFLINE_MODEL
from orchestration.models import AgentDispatch, AgentProfile, Turn
from orchestration.records.catalogue import AGENT_CREATED
from orchestration.records.events import event_new, events_record
from orchestration.records.inserts import insert
from skills import registry
from skills.base import Domain

# Every column of a new dispatch (orchestration/records/inserts.py: a wave's rows in one
# INSERT, without the UNNEST arrays `bulk_create` has psycopg escape in Python: 1.0 ms
# of CPU for eight agents instead of 2.4).
DISPATCH_FIELDS = tuple(f.name for f in AgentDispatch._meta.concrete_fields if not f.primary_key)


@dataclass
class Planned:
    call: ToolCall
    spec: dict = field(default_factory=dict)
    profile: AgentProfile | None = None
    error: str = ""


def profiles_by_name() -> dict[str, AgentProfile]:
    return {p.name: p for p in AgentProfile.objects.all()}


def skill_domains(calls: list[ToolCall], owner) -> dict[str, Domain]:
    """The domains a batch's skills are checked against, found before the caller takes
    the turn's lock: with an MCP skill named, listing its server's tools may start the
    server's process or wait on its network (up to its timeouts), which must not happen
    while the lock (on SQLite, the database's one writer) is held."""
    named_mcp = any(registry.MCP_PREFIX in call.arguments for call in calls)
    return registry.domains_for(owner if named_mcp else None)


def plan_batch(
    *, turn: Turn, calls: list[ToolCall], dispatches: list[AgentDispatch], domains: dict[str, Domain],
    parent: AgentDispatch | None = None, profiles: dict[str, AgentProfile] | None = None,
) -> list[Planned]:
    """Validate every call; the survivors are ready to create, in order. `dispatches`:
    the turn's, as the caller read them under the turn's lock (it schedules with them
    next); `domains`: the skills that may be granted (`skill_domains`); `profiles`: as
    the caller read them, if it did."""
    limits = Limits.from_json(turn.limits)
    profiles = profiles if profiles is not None else profiles_by_name()
    schema = dispatch_agent_parameters(
        profile_names=list(profiles), max_tool_calls_cap=limits.agent_max_tool_calls_cap
    )
    allowed_for_parent = set(parent.skills) if parent else None
    planned = []
    for call in calls:
        spec, error = parse_arguments(call.arguments, schema)
        item = Planned(call=call, spec=spec or {}, error=error)
        if not error:
            item.profile = profiles.get(spec.get("profile", ""))
            item.error = _skill_problem(spec["skills"], item.profile, allowed_for_parent, domains)
        planned.append(item)

    # agent_ids are unique in the whole turn, but an agent may only depend on its
    # siblings (same parent): the orchestrator's agents on each other, a delegating
    # agent's children on each other. Anything else could wait on its own parent.
    used = {d.agent_id for d in dispatches}
    siblings = {d.agent_id: d for d in dispatches if d.parent_id == (parent.pk if parent else None)}
    seen: set[str] = set()
    for item in planned:
        if item.error:
            continue
        agent_id = item.spec["agent_id"]
        if agent_id in used or agent_id in seen:
            item.error = f"agent_id {agent_id!r} is already used in this turn; choose another."
        seen.add(agent_id)

    batch_ids = {i.spec["agent_id"] for i in planned if not i.error}
    for item in planned:
        if item.error:
            continue
        depends_on = item.spec.get("depends_on", [])
        unknown = [dep for dep in depends_on if dep not in siblings and dep not in batch_ids]
        ended = [f"{dep} ({lifecycle.result_status(siblings[dep])})" for dep in depends_on
                 if dep in siblings and lifecycle.is_terminal(siblings[dep]) and not lifecycle.succeeded(siblings[dep])]
        if unknown:
            known = sorted(set(siblings) | batch_ids)
            item.error = (
                f"depends_on names unknown agents {unknown}; known agent_ids: {known or 'none'}."
            )
        elif ended:
            item.error = f"depends_on names agents that ended without success: {', '.join(ended)}; it could never start."
    _refuse_unstartable(planned, siblings)
    return planned


def _skill_problem(skills: list[str], profile: AgentProfile | None, parent_skills: set | None,
                   found: dict[str, Domain]) -> str:
    known = {skill.name for domain in found.values() for skill in domain.skills}
    unknown = [name for name in skills if name not in known]
    down = {domain.name: domain.unavailable for name in unknown if "." in name
            and (domain := found.get(name.rsplit(".", 1)[0])) is not None and domain.unavailable}
    if down:
        return "; ".join(f"{name} is {why}" for name, why in down.items()) + \
            ". Plan without it, or tell the user it cannot be used now."
    if unknown:
        return (
            f"unknown skills {unknown}. Call get_skill to list a domain's skills; "
            f"valid names look like 'tasks.search' (or 'mcp.<server>.<tool>')."
        )
    if parent_skills is not None:
        outside = [name for name in skills if name not in parent_skills]
        if outside:
            return f"a nested agent may only get a subset of its parent's skills; not allowed: {outside}."
    if profile is not None:
        if profile.allowed_skills:
            outside = [name for name in skills if name not in profile.allowed_skills]
            if outside:
                return (
                    f"profile {profile.name!r} may not use {outside}; "
                    f"it allows {sorted(profile.allowed_skills)}."
                )
        if profile.read_only:
            writes = [n for n in skills if not _reads(n, found)]
            if writes:
                return f"profile {profile.name!r} is read-only and may not use {writes}."
    return ""


def _reads(name: str, found: dict[str, Domain]) -> bool:
    skill = registry.skill_in(found, name)
    return skill is not None and skill.read_only  # an MCP server down: what it would do is not known


def _refuse_unstartable(planned: list[Planned], existing: dict[str, AgentDispatch]) -> None:
    """Refuse, until none is left, the dependents of refused batch members and the
    members of each cycle. (An existing agent cannot be in a cycle: it was checked when
    it was created, and it cannot depend on agents created after it.)"""
    refused = {i.spec.get("agent_id") for i in planned if i.error and i.spec.get("agent_id") not in existing}
    while True:
        valid = {i.spec["agent_id"]: i for i in planned if not i.error}
        for item in valid.values():
            blocked = [dep for dep in item.spec.get("depends_on", []) if dep not in valid and dep in refused]
            if blocked:
                item.error = f"depends_on names {', '.join(blocked)}, refused in this batch; it could never start."
                refused.add(item.spec["agent_id"])
        if any(item.error for item in valid.values()):
            continue
        cycle = _a_cycle({agent_id: item.spec.get("depends_on", []) for agent_id, item in valid.items()})
        if not cycle:
            return
        for agent_id in set(cycle):
            valid[agent_id].error = f"depends_on forms a cycle: {' -> '.join(cycle)}. Remove one dependency."
            refused.add(agent_id)


def _a_cycle(graph: dict[str, list[str]]) -> list[str]:
    """One cycle of the graph (as graphlib reports it, first node repeated last), or []."""
    try:
        TopologicalSorter({node: [d for d in deps if d in graph] for node, deps in graph.items()}).prepare()
    except CycleError as exc:
        return exc.args[1]
    return []


def dispatch_batch(*, turn: Turn, calls: list[ToolCall], task_prompt: str, domains: dict[str, Domain],
                   parent: AgentDispatch | None = None, step_idx: int | None = None, outside: Sequence[str] = (),
                   profiles: dict[str, AgentProfile] | None = None) -> list[Planned]:
    """Plan `calls` (top-level, or children of `parent`), take their slots of the turn's
    agent limit (children too: limits count the whole tree), create the valid ones and
    queue what can start; returns the plan, refusals included. The caller holds the
    turn's lock: the turn's agents are read once, for the plan and for the schedule;
    `domains` it found before (`skill_domains`)."""
    dispatches = lifecycle.schedule_rows(turn)
    planned = plan_batch(turn=turn, calls=calls, dispatches=dispatches, domains=domains, parent=parent,
                         profiles=profiles)
    valid = [item for item in planned if not item.error]
    reserve_agents(turn=turn, agent_ids=[item.spec["agent_id"] for item in valid])
    created = dispatches_create(turn=turn, items=valid, task_prompt=task_prompt, parent=parent, step_idx=step_idx,
                                outside=outside)
    lifecycle.dispatch_schedule(turn, dispatches + created)
    return planned


def reserve_agents(*, turn: Turn, agent_ids: list[str]) -> None:
    """Atomically take a slot of the turn's agents for each of `agent_ids`, or trip the
    turn's agent limit (the pause names them: they are what waits for the answer)."""
    from django.db.models import F

    count = len(agent_ids)
    if count == 0:
        return
    limit = Limits.from_json(turn.limits).turn_max_agents
    taken = Turn.objects.filter(pk=turn.pk, agents_dispatched__lte=limit - count).update(
        agents_dispatched=F("agents_dispatched") + count
    )
    if not taken:
        raise LimitTripped(
            "turn_max_agents",
            f"This turn may dispatch {limit} agents; {count} more were asked for.",
            detail={"limit": limit, "used": turn.agents_dispatched, "requested": count, "asked_for": agent_ids},
        )


def contract_for(
    *,
    turn: Turn,
    spec: dict,
    profile: AgentProfile | None,
    depth: int,
    task_prompt: str,
    parent: AgentDispatch | None = None,
    step_idx: int | None = None,
) -> dict:
    """The delegation contract of seed 003, stored on the dispatch.

    The parent run is the turn's orchestrator, or for a nested agent the dispatch that
    delegated to it (and `step_idx` that agent's step).
    """
    limits = Limits.from_json(turn.limits)
    can_spawn = bool(profile and profile.may_delegate) and depth < limits.max_delegation_depth
    run_id = f"turn-{turn.pk}" + (f"/agent-{parent.agent_id}" if parent else "")
    return {
        "parent": {
            "run_id": run_id,
            "agent_id": parent.agent_id if parent else None,
            "step_idx": turn.llm_iterations if step_idx is None else step_idx,
            "task_prompt": task_prompt,
            "goal_summary": task_prompt[:200],
        },
        "step": {
            "title": spec["agent_id"],
            "description": spec["mission"],
            "success_criteria": ["The mission is done, or the report says why it is not."],
        },
        "permissions": {
            "allowed_tools": sorted(spec["skills"]),
            "can_spawn_children": can_spawn,
            "max_delegation_depth": limits.max_delegation_depth if can_spawn else 0,
        },
        "execution": {
            "attempt_timeout_ms": int(limits.agent_timeout_seconds * 1000),
            "max_retries": limits.agent_max_retries,
            "close_on_completion": True,
        },
        "outputs": {"report_format": "markdown"},
    }


def dispatches_create(
    *,
    turn: Turn,
    items: Sequence[Planned],
    task_prompt: str,
    parent: AgentDispatch | None = None,
    step_idx: int | None = None,
    outside: Sequence[str] = (),
) -> list[AgentDispatch]:
    """Create validated dispatches (top-level, or children of `parent`) and their events,
    in two statements however many there are.

    Each starts with the outside content that had reached whoever wrote its mission: the
    turn's (the conversation's and the orchestrator's reading), and for a child what
    its parent had seen at that moment (`outside`: the parent's run so far, which its
    row holds only once it ends). The caller holds the turn lock and has reserved the
    agent slots.
    """
    if not items:
        return []
    limits = Limits.from_json(turn.limits)
    depth = (parent.depth + 1) if parent else 1
    dispatches = [_new_dispatch(turn=turn, item=item, limits=limits, depth=depth, task_prompt=task_prompt,
                                parent=parent, step_idx=step_idx, outside=outside) for item in items]
    insert(dispatches, DISPATCH_FIELDS)
    events_record([_created_event(dispatch, parent) for dispatch in dispatches])
    return dispatches


def _new_dispatch(*, turn: Turn, item: Planned, limits: Limits, depth: int, task_prompt: str,
                  parent: AgentDispatch | None, step_idx: int | None, outside: Sequence[str]) -> AgentDispatch:
    spec, profile = item.spec, item.profile
    requested = spec.get("max_tool_calls") or (profile.max_tool_calls if profile else None)
    return AgentDispatch(
        turn=turn,
        agent_id=spec["agent_id"],
        parent=parent,
        depth=depth,
        profile=profile,
        profile_name=profile.name if profile else "",
        profile_version=profile.version if profile else None,
        model=model_for(profile),
        mission=spec["mission"],
        skills=sorted(spec["skills"]),
        context=spec.get("context", ""),
        depends_on=spec.get("depends_on", []),
        max_tool_calls=limits.agent_tool_budget(requested),
        contract=contract_for(
            turn=turn, spec=spec, profile=profile, depth=depth, task_prompt=task_prompt,
            parent=parent, step_idx=step_idx,
        ),
        tool_call_id=item.call.id,
        outside=lifecycle.merged(turn.outside, parent.outside if parent else [], outside),
    )


def _created_event(dispatch: AgentDispatch, parent: AgentDispatch | None):
    waits = f", after {', '.join(dispatch.depends_on)}" if dispatch.depends_on else ""
    by = f" (by {parent.agent_id})" if parent else ""
    return event_new(
        type=AGENT_CREATED,
        dispatch=dispatch,
        summary=f"{dispatch.agent_id} created{by}: {dispatch.mission[:120]}{waits}",
        payload={
            "sub_agent_id": dispatch.agent_id, "mission": dispatch.mission, "skills": dispatch.skills,
            "depends_on": dispatch.depends_on, "max_tool_calls": dispatch.max_tool_calls,
            "profile": dispatch.profile_name, "parent": parent.agent_id if parent else None,
            "depth": dispatch.depth, "contract": dispatch.contract,
        },
    )


def can_delegate(dispatch: AgentDispatch, limits: Limits) -> bool:
    """Whether this agent gets dispatch_agent / get_agent_results (its contract says so,
    and the depth limit in force still allows a level below it)."""
    permissions = (dispatch.contract or {}).get("permissions", {})
    return bool(permissions.get("can_spawn_children")) and dispatch.depth < limits.max_delegation_depth


def dispatch_result_json(agent_id: str) -> str:
    return json.dumps({"agent_id": agent_id, "status": "dispatched"})


def model_for(profile: AgentProfile | None) -> str:
    """The model the agent's calls go to. Offline, that is the planner, whatever a
    profile or the settings name: a record names the model that actually answers."""
    if settings.ASSISTANT_LLM_PROVIDER == "offline":
        return OFFLINE_MODEL
    return (profile.model if profile and profile.model else "") or settings.ASSISTANT_AGENT_MODEL
