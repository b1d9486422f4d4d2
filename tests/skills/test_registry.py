"""The registry: domains, their skills and schemas, and errors that name what exists."""

from __future__ import annotations

import pytest

from skills import registry
from skills.base import Domain, Skill
from skills.registry import UnknownDomain, UnknownSkill

ALL_SKILLS = [
    "calendar.cancel_event",
    "calendar.create_event",
    "calendar.list_events",
    "email.search_sent",
    "email.send",
    "files.append",
    "files.list",
    "files.read",
    "files.write",
    "memory.save",
    "memory.search",
    "tasks.complete",
    "tasks.create",
    "tasks.search",
    "tasks.update",
]
READ_ONLY = [
    "calendar.list_events",
    "email.search_sent",
    "files.list",
    "files.read",
    "memory.search",
    "tasks.search",
]


def test_every_skill_is_registered():
    assert registry.skill_names() == ALL_SKILLS
    assert [skill.name for skill in registry.all_skills()] == ALL_SKILLS


def test_read_only_skills():
    assert registry.skill_names(read_only=True) == READ_ONLY
    assert registry.skill_names(read_only=False) == sorted(set(ALL_SKILLS) - set(READ_ONLY))


def test_domains_are_listed_with_one_line_each():
    listed = registry.domains()
    assert [entry["domain"] for entry in listed] == [
        "calendar",
        "email",
        "files",
        "memory",
        "tasks",
    ]
    assert all(entry["description"] and "\n" not in entry["description"] for entry in listed)


def test_describe_domain():
    described = registry.describe_domain("tasks")
    assert described["domain"] == "tasks"
    assert [s["name"] for s in described["skills"]] == [
        "tasks.complete",
        "tasks.create",
        "tasks.search",
        "tasks.update",
    ]
    search = described["skills"][2]
    assert set(search) == {"name", "description", "parameters", "read_only"}
    assert search["read_only"] is True and search["parameters"]["type"] == "object"


def test_unknown_domain_names_the_valid_ones():
    with pytest.raises(
        UnknownDomain,
        match="unknown domain 'weather'; valid domains: calendar, email, files, memory, tasks",
    ):
        registry.describe_domain("weather")


def test_unknown_skill_in_a_known_domain_names_that_domains_skills():
    with pytest.raises(UnknownSkill) as raised:
        registry.get_skill("email.delete")
    assert (
        str(raised.value)
        == "unknown skill 'email.delete'; email skills: email.search_sent, email.send"
    )


def test_unknown_skill_elsewhere_names_all_skills():
    with pytest.raises(UnknownSkill) as raised:
        registry.get_skill("weather.today")
    assert str(raised.value).endswith("valid skills: " + ", ".join(ALL_SKILLS))


class TestGetSkillTool:
    """What the orchestrator's get_skill tool answers (DESIGN.md §3)."""

    @pytest.mark.parametrize("domain", [None, ""])
    def test_without_a_domain(self, domain):
        assert registry.get_skill_tool_result(domain) == {"domains": registry.domains()}

    def test_with_a_domain(self):
        assert registry.get_skill_tool_result("files") == registry.describe_domain("files")

    def test_unknown_domain_is_an_error_result(self):
        result = registry.get_skill_tool_result("weather")
        valid = "calendar, email, files, memory, tasks"
        assert result == {"error": f"unknown domain 'weather'; valid domains: {valid}"}


def _walk(schema: dict, where: str):
    yield where, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{where}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{where}[]")


@pytest.mark.parametrize("skill", registry.all_skills(), ids=lambda skill: skill.name)
def test_every_schema_is_closed_and_bounded(skill):
    for where, schema in _walk(skill.parameters, skill.name):
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        if "object" in types:
            assert schema.get("additionalProperties") is False, where
        if "string" in types and "enum" not in schema:
            assert "maxLength" in schema, where
        if "array" in types:
            assert "maxItems" in schema, where


@pytest.mark.parametrize("skill", registry.all_skills(), ids=lambda skill: skill.name)
def test_every_parameter_is_described(skill):
    assert skill.description.endswith(".")
    for name, schema in skill.parameters["properties"].items():
        assert schema.get("description"), name


class TestContract:
    def test_names_must_be_dotted(self):
        with pytest.raises(ValueError, match=r"domain\.action"):
            Skill(
                name="search",
                description="",
                parameters={"type": "object", "additionalProperties": False},
                handler=lambda user: {},
            )

    def test_parameters_must_be_a_closed_object(self):
        with pytest.raises(ValueError, match="closed object schema"):
            Skill(
                name="tasks.x",
                description="",
                parameters={"type": "object"},
                handler=lambda user: {},
            )

    def test_a_skill_belongs_to_its_domain(self):
        skill = registry.get_skill("tasks.search")
        with pytest.raises(ValueError, match="does not belong"):
            Domain(name="calendar", description="", skills=(skill,))
