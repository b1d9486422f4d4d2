"""Every skill the assistant has, by domain: the one place that maps names to skills.

`catalogue` is what the orchestrator's system prompt lists; `get_skill_tool_result` is
its `get_skill` tool (DESIGN.md §3), for the full schemas. Lookups
read `DOMAINS` each time, so a test (or a plug-in) can add a domain with one dict entry.

The built-in domains are everyone's. MCP servers (skills/mcp/) add domains
`mcp.<server>` for the users staff chose: every lookup made for a user (`user=`) sees
them, one made without a user only the built-ins. A server that is down is listed as
unavailable, and its skills answer "unavailable" when called (`SkillUnavailable`).
"""

from __future__ import annotations

from skills.base import Domain, Skill
from skills.domains.calendar.skills import DOMAIN as CALENDAR
from skills.domains.email.skills import DOMAIN as EMAIL
from skills.domains.files.skills import DOMAIN as FILES
from skills.domains.memory.skills import DOMAIN as MEMORY
from skills.domains.tasks.skills import DOMAIN as TASKS

DOMAINS: dict[str, Domain] = {
    domain.name: domain for domain in (TASKS, CALENDAR, EMAIL, MEMORY, FILES)
}
MCP_PREFIX = "mcp."


class UnknownDomain(LookupError):
    pass


class UnknownSkill(LookupError):
    pass


class SkillUnavailable(UnknownSkill):
    """A skill of a domain that cannot be used now (its MCP server is down)."""


def domains_for(user=None) -> dict[str, Domain]:
    """The domains `user` may use: the built-ins, and with a user their MCP servers'."""
    if user is None:
        return DOMAINS
    from skills.mcp import domains_for as mcp_domains

    return DOMAINS | mcp_domains(user)


def domains(user=None) -> list[dict]:
    found = domains_for(user)
    return [{"domain": name, "description": found[name].description}
            | ({"unavailable": found[name].unavailable} if found[name].unavailable else {})
            for name in sorted(found)]


def skill_in(found: dict[str, Domain], name: str) -> Skill | None:
    """The skill called `name` among domains already found (`domains_for`), without
    looking anything up again; None when it is not there or its domain is unavailable now."""
    domain = found.get(name.rsplit(".", 1)[0])
    return domain.get(name) if domain is not None and not domain.unavailable else None


def get_domain(name: str, user=None) -> Domain:
    found = domains_for(user) if isinstance(name, str) and name.startswith(MCP_PREFIX) else DOMAINS
    domain = found.get(name) if isinstance(name, str) else None
    if domain is None:
        raise UnknownDomain(f"unknown domain {name!r}; valid domains: {', '.join(sorted(domains_for(user)))}")
    return domain


def describe_domain(name: str, user=None) -> dict:
    domain = get_domain(name, user)
    if domain.unavailable:
        return {"domain": domain.name, "description": domain.description, "error": domain.unavailable}
    return {
        "domain": domain.name,
        "description": domain.description,
        "skills": [skill.describe() for skill in sorted(domain.skills, key=_by_name)],
    }


def get_skill(name: str, user=None) -> Skill:
    """The skill called `name` (for `user`: their MCP servers' too); the error names the
    skills the caller probably meant."""
    if isinstance(name, str):
        found = domains_for(user) if name.startswith(MCP_PREFIX) else DOMAINS
        domain = found.get(name.rsplit(".", 1)[0]) if "." in name else None
        if domain is not None and domain.unavailable:
            raise SkillUnavailable(f"skill {name!r} cannot be used now: {domain.name} is {domain.unavailable}")
        skill = domain.get(name) if domain else None
        if skill is not None:
            return skill
        if domain is not None:
            valid = ", ".join(sorted(s.name for s in domain.skills))
            raise UnknownSkill(f"unknown skill {name!r}; {domain.name} skills: {valid}")
    raise UnknownSkill(f"unknown skill {name!r}; valid skills: {', '.join(skill_names())}")


def all_skills(user=None) -> list[Skill]:
    return sorted((skill for domain in domains_for(user).values() for skill in domain.skills), key=_by_name)


def skill_names(*, read_only: bool | None = None, user=None) -> list[str]:
    """Sorted names; `read_only=True` gives the skills a read-only profile may be granted."""
    return [s.name for s in all_skills(user) if read_only is None or s.read_only == read_only]


def get_skill_tool_result(domain: str | None, user=None) -> dict:
    """The orchestrator's `get_skill`: domains without an argument, one domain's skills with."""
    if domain is None or domain == "":
        return {"domains": domains(user)}
    try:
        return describe_domain(domain, user)
    except UnknownDomain as exc:
        return {"error": str(exc)}


def catalogue(user=None) -> str:
    """What the orchestrator plans from, in its system prompt: every domain, sorted, with
    each skill's name, whether it only reads, and the first sentence of its description.

    No parameter schemas: the orchestrator only grants skills, and the sub-agent gets
    the schemas of its own in `use_skill`. Byte-stable, so that an endpoint's prompt
    cache keeps it: it changes only when the skill set does (or an MCP server goes
    down or comes back)."""
    lines = []
    found = domains_for(user)
    for name in sorted(found):
        domain = found[name]
        if domain.unavailable:
            lines.append(f"{name}: {_first_sentence(domain.description)} ({domain.unavailable})")
            continue
        lines.append(f"{name}: {_first_sentence(domain.description)}")
        lines += [f"- {skill.name} ({'reads' if skill.read_only else 'writes'}): {_first_sentence(skill.description)}"
                  for skill in sorted(domain.skills, key=_by_name)]
    return "\n".join(lines)


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def _by_name(skill: Skill) -> str:
    return skill.name
