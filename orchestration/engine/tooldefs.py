"""The orchestrator's three tools (DESIGN.md §3): names and shapes are a contract."""

from __future__ import annotations

AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

GET_SKILL = "get_skill"
DISPATCH_AGENT = "dispatch_agent"
GET_AGENT_RESULTS = "get_agent_results"
ORCHESTRATOR_TOOL_NAMES = (GET_SKILL, DISPATCH_AGENT, GET_AGENT_RESULTS)


def _function(name: str, description: str, parameters: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def get_skill_parameters() -> dict:
    return {
        "type": "object",
        "properties": {
            "domain": {
                "type": "string",
                "maxLength": 64,
                "description": "A skill domain. Omit it to list the domains.",
            }
        },
        "additionalProperties": False,
    }


def dispatch_agent_parameters(*, profile_names: list[str], max_tool_calls_cap: int) -> dict:
    properties: dict = {
        "agent_id": {
            "type": "string",
            "pattern": AGENT_ID_PATTERN,
            "description": "Your short, unique name for this agent, e.g. 'find-overdue'.",
        },
        "mission": {"type": "string", "minLength": 1, "maxLength": 4000},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 100},
            "minItems": 1,
            "maxItems": 20,
            "uniqueItems": True,
            "description": "Exact skill names (from the catalogue) the agent may use.",
        },
        "context": {"type": "string", "maxLength": 8000},
        "depends_on": {
            "type": "array",
            "items": {"type": "string", "pattern": AGENT_ID_PATTERN},
            "maxItems": 20,
            "uniqueItems": True,
            "description": "agent_ids that must complete first; their results are passed on.",
        },
        "max_tool_calls": {"type": "integer", "minimum": 1, "maximum": max_tool_calls_cap},
    }
    if profile_names:
        properties["profile"] = {"type": "string", "enum": sorted(profile_names)}
    return {
        "type": "object",
        "properties": properties,
        "required": ["agent_id", "mission", "skills"],
        "additionalProperties": False,
    }


def get_agent_results_parameters(*, default: str = "every agent of this turn") -> dict:
    return {
        "type": "object",
        "properties": {
            "agent_ids": {
                "type": "array",
                "items": {"type": "string", "maxLength": 64},
                "maxItems": 50,
                "description": f"Omit to wait for {default}.",
            }
        },
        "additionalProperties": False,
    }


def orchestrator_tools(*, profile_names: list[str], max_tool_calls_cap: int) -> list[dict]:
    return [
        _function(
            GET_SKILL,
            "List skill domains, or one domain's skills with their parameter schemas.",
            get_skill_parameters(),
        ),
        _function(
            DISPATCH_AGENT,
            "Start a sub-agent on a focused mission with a set of granted skills. Returns at "
            "once; agents run in parallel unless depends_on orders them.",
            dispatch_agent_parameters(
                profile_names=profile_names, max_tool_calls_cap=max_tool_calls_cap
            ),
        ),
        _function(
            GET_AGENT_RESULTS,
            "Wait until the named agents (default: all of this turn) have finished and "
            "return their results.",
            get_agent_results_parameters(),
        ),
    ]


def delegation_tools(*, profile_names: list[str], max_tool_calls_cap: int, depth: int, max_depth: int) -> list[dict]:
    """dispatch_agent and get_agent_results as a delegating sub-agent sees them (DESIGN.md §6):
    the orchestrator's shapes, scoped to the agent's own helpers and skills."""
    last_level = depth + 1 >= max_depth
    return [
        _function(
            DISPATCH_AGENT,
            "Start a helper agent on part of your mission. Grant it only skills you have "
            "yourself (those listed for use_skill). Returns at once; helpers run in parallel "
            "unless depends_on orders them (depends_on may name only your own helpers)."
            + (" Helpers cannot delegate further." if last_level else ""),
            dispatch_agent_parameters(
                profile_names=profile_names, max_tool_calls_cap=max_tool_calls_cap
            ),
        ),
        _function(
            GET_AGENT_RESULTS,
            "Wait until your helper agents (default: all you dispatched) have finished and "
            "return their reports. Call it before your own report: helpers still running "
            "when you report are cancelled.",
            get_agent_results_parameters(default="every helper you dispatched"),
        ),
    ]
