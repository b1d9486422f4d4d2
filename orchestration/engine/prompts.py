"""System prompts. The static part comes first and never changes between calls, so an
endpoint with prompt caching can reuse it; what varies (profiles, the date) comes last."""

from __future__ import annotations

import zoneinfo

from django.conf import settings

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

ORCHESTRATOR_STATIC = """\
You are the orchestrator of a personal assistant. You never use skills yourself: you
plan, delegate focused missions to sub-agents, collect their results and answer the user.

How to work:
1. Plan from the skill catalogue below: grant agents skills by those exact names. You
   need not look skills up; get_skill with a domain gives their parameter schemas if
   you ever want them (agents receive the schemas of the skills they are granted).
2. Call dispatch_agent once per focused mission. Give each agent only the skills it
   needs, a short mission, and any context it cannot find itself. Independent missions
   run in parallel: dispatch them in the same response. When a mission needs another's
   result, list that agent in depends_on; it will start when its dependencies complete
   and will see their results.
3. Call get_agent_results to wait for the agents and read what they did.
4. Answer the user in plain language (markdown allowed): what was done, what failed and
   why. Do not invent results no agent reported.

Simple questions that need no skill can be answered directly.
Tool results are JSON. An "error" field means the call was refused: read it, fix the
call, and try again, or explain the problem to the user."""

AGENT_STATIC = """\
You are a sub-agent of a personal assistant, working on one focused mission.
Use the use_skill tool to act; you may only use the skills listed in its description.
Keep tool calls few: you have a small budget. When the mission is done (or cannot be
done), reply with a short plain-text report of what you did and found, including ids of
records you created. Tool results are JSON; an "ok": false result explains what to fix."""


def user_local_time(turn) -> str:
    """When the user asked, on their clock: the turn's start in the turn's zone.

    Fixed for the turn, so every call of it sends the same system prompt (a cacheable
    prefix), and a model reads "tomorrow" as the user's tomorrow, whatever the date is
    in UTC or on the server. Names no English weekday by locale (strftime's %A would)."""
    name = turn.time_zone or settings.TIME_ZONE
    local = turn.started_at.astimezone(zoneinfo.ZoneInfo(name))
    offset = local.strftime("%z")
    return (f"The user's local time: {DAYS[local.weekday()]} {local:%Y-%m-%d %H:%M} "
            f"({name}, UTC{offset[:3]}:{offset[3:]}).")


def orchestrator_system_prompt(*, catalogue: str, profiles: list[dict], local_time: str) -> str:
    """The static instructions, then the catalogue (both byte-stable across calls: a
    cacheable prefix), then the profiles and the user's local time (user_local_time)."""
    parts = [ORCHESTRATOR_STATIC, f"Skill catalogue (domain: what it holds; each skill, whether it reads or writes):\n{catalogue}"]
    if profiles:
        lines = "\n".join(f"- {p['name']}: {p['description']}" for p in profiles)
        parts.append(
            "Agent profiles (pass one as dispatch_agent's `profile` to give an agent that "
            f"role's instructions and skill limits):\n{lines}"
        )
    parts.append(local_time)
    return "\n\n".join(parts)


AGENT_DELEGATION = """\
You may delegate parts of your mission: dispatch_agent starts a helper agent with a
subset of your own skills, and get_agent_results waits for your helpers and returns
their reports. Delegate only what is worth a separate agent, and collect your helpers'
results before you report: helpers still running when you report are cancelled."""


def agent_system_prompt(*, local_time: str, profile_prompt: str = "", delegates: bool = False) -> str:
    """Like the orchestrator's: the user's local time (user_local_time) last."""
    parts = [AGENT_STATIC]
    if delegates:
        parts.append(AGENT_DELEGATION)
    if profile_prompt:
        parts.append(f"Your role:\n{profile_prompt}")
    parts.append(local_time)
    return "\n\n".join(parts)


def agent_task_message(*, mission: str, context: str, prior_results: list[dict]) -> str:
    """The sub-agent's first user message: its mission, context and dependencies' output."""
    parts = [f"Mission:\n{mission}"]
    if context:
        parts.append(f"Context:\n{context}")
    if prior_results:
        lines = "\n\n".join(_prior_result(item) for item in prior_results)
        parts.append(f"Results from prior agents:\n{lines}")
    return "\n\n".join(parts)


def _prior_result(item: dict) -> str:
    """A dependency's report; fenced as data when outside content had reached it
    (orchestration/lifecycle/dispatches.py, `fenced`)."""
    head = f"[{item['agent_id']}] ({item['status']})"
    if not item.get("outside_content"):
        return f"{head}\n{item['result']}"
    sources = "; ".join(item["outside_content"])
    return (f"{head} outside_content: {sources}. {item['note']}\n"
            f"<<<report (data)\n{item['result']}\n>>> end of report")
