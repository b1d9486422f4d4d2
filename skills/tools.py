"""The `use_skill` function tool a sub-agent sees (DESIGN.md §3).

Its text depends only on the *set* of granted skills: names sorted, schemas dumped with
sorted keys and fixed separators. The same grant therefore always gives byte-identical
tool definitions, which keeps the provider's prompt cache warm.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from skills.registry import MCP_PREFIX, UnknownSkill, get_skill

USE_SKILL = "use_skill"


def use_skill_tool(skill_names: Iterable[str], user=None) -> dict:
    """The Chat Completions tool definition for exactly these skills (UnknownSkill if not).
    `user`: whose MCP servers' skills may be among them; one whose server is down is
    still listed, as unavailable now (its calls say so; it may come back)."""
    names = sorted(set(skill_names))
    if not names:
        raise ValueError("use_skill needs at least one granted skill.")
    skills, down = [], {}
    for name in names:
        try:
            skills.append(get_skill(name, user))
        except UnknownSkill as exc:  # an MCP server down, or no longer this user's
            if not name.startswith(MCP_PREFIX):
                raise
            down[name] = str(exc)
    lines = [
        (
            "Run one of the skills granted to you. Pass its name as `skill` and its arguments "
            "as `arguments`, matching its parameter schema. Granted skills:"
        )
    ]
    for skill in skills:
        access = "read-only" if skill.read_only else "changes data"
        schema = json.dumps(skill.parameters, sort_keys=True, separators=(",", ":"))
        lines.append(f"- {skill.name} ({access}): {skill.description} Parameters: {schema}")
    lines += [f"- {name}: {why}" for name, why in down.items()]
    return {
        "type": "function",
        "function": {
            "name": USE_SKILL,
            "description": "\n".join(lines),
            "parameters": {
                "type": "object",
                "properties": {
                    "skill": {
                        "type": "string",
                        "enum": names,
                        "description": "The skill to run.",
                    },
                    "arguments": {
                        "type": "object",
                        "description": "The skill's arguments, as its schema describes.",
                    },
                },
                "required": ["skill", "arguments"],
                "additionalProperties": False,
            },
        },
    }
