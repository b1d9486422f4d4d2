"""Every skill the assistant has, by domain: the one place that maps names to skills.

`catalogue` is what the orchestrator's system prompt lists; `get_skill_tool_result` is
its `get_skill` tool (DESIGN.md §3), for the full schemas. Lookups
read `DOMAINS` each time, so a test (or a plug-in) can add a domain with one dict entry.
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


class UnknownDomain(LookupError):
    pass


class UnknownSkill(LookupError):
    pass


def domains() -> list[dict]:
    return [{"domain": name, "description": DOMAINS[name].description} for name in sorted(DOMAINS)]


def get_domain(name: str) -> Domain:
    domain = DOMAINS.get(name) if isinstance(name, str) else None
    if domain is None:
        raise UnknownDomain(f"unknown domain {name!r}; valid domains: {', '.join(sorted(DOMAINS))}")
    return domain


def describe_domain(name: str) -> dict:
    domain = get_domain(name)
    return {
        "domain": domain.name,
        "description": domain.description,
        "skills": [skill.describe() for skill in sorted(domain.skills, key=_by_name)],
    }


def get_skill(name: str) -> Skill:
    """The skill called `name`; the error names the skills the caller probably meant."""
    if isinstance(name, str):
        domain = DOMAINS.get(name.split(".", 1)[0])
        skill = domain.get(name) if domain else None
        if skill is not None:
            return skill
        if domain is not None:
            valid = ", ".join(sorted(s.name for s in domain.skills))
            raise UnknownSkill(f"unknown skill {name!r}; {domain.name} skills: {valid}")
    raise UnknownSkill(f"unknown skill {name!r}; valid skills: {', '.join(skill_names())}")


def all_skills() -> list[Skill]:
    return sorted((skill for domain in DOMAINS.values() for skill in domain.skills), key=_by_name)


def skill_names(*, read_only: bool | None = None) -> list[str]:
    """Sorted names; `read_only=True` gives the skills a read-only profile may be granted."""
    return [s.name for s in all_skills() if read_only is None or s.read_only == read_only]


def get_skill_tool_result(domain: str | None) -> dict:
    """The orchestrator's `get_skill`: domains without an argument, one domain's skills with."""
    if domain is None or domain == "":
        return {"domains": domains()}
    try:
        return describe_domain(domain)
    except UnknownDomain as exc:
        return {"error": str(exc)}


def catalogue() -> str:
    """What the orchestrator plans from, in its system prompt: every domain, sorted, with
    each skill's name, whether it only reads, and the first sentence of its description.

    No parameter schemas: the orchestrator only grants skills, and the sub-agent gets
    the schemas of its own in `use_skill`. Byte-stable, so that an endpoint's prompt
    cache keeps it: it changes only when the skill set does."""
    lines = []
    for name in sorted(DOMAINS):
        domain = DOMAINS[name]
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
