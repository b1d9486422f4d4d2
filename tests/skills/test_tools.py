"""The use_skill tool definition a sub-agent sees (DESIGN.md §3)."""

from __future__ import annotations

import json

import pytest

from skills.registry import UnknownSkill, get_skill
from skills.tools import use_skill_tool


def test_enum_is_exactly_the_granted_skills_sorted():
    tool = use_skill_tool(["tasks.search", "calendar.list_events", "tasks.create"])
    parameters = tool["function"]["parameters"]
    assert tool["type"] == "function" and tool["function"]["name"] == "use_skill"
    assert parameters["properties"]["skill"]["enum"] == [
        "calendar.list_events",
        "tasks.create",
        "tasks.search",
    ]
    assert parameters["properties"]["arguments"]["type"] == "object"
    assert parameters["required"] == ["skill", "arguments"]


def test_the_same_grant_gives_byte_identical_definitions():
    one = use_skill_tool(["tasks.search", "email.send", "files.read"])
    other = use_skill_tool(("files.read", "tasks.search", "email.send", "tasks.search"))
    assert json.dumps(one) == json.dumps(other)


def test_the_description_lists_each_skill_with_its_schema():
    description = use_skill_tool(["tasks.search", "email.send"])["function"]["description"]
    lines = description.splitlines()
    assert lines[1].startswith("- email.send (changes data): Send a plain-text email now.")
    assert lines[2].startswith("- tasks.search (read-only): ")
    schema = json.dumps(get_skill("tasks.search").parameters, sort_keys=True, separators=(",", ":"))
    assert lines[2].endswith(f"Parameters: {schema}")
    assert "calendar." not in description


def test_unknown_names_are_refused():
    with pytest.raises(UnknownSkill):
        use_skill_tool(["tasks.search", "tasks.delete"])


def test_an_empty_grant_is_refused():
    with pytest.raises(ValueError):
        use_skill_tool([])


def test_a_call_outside_the_grant_is_refused_at_run_time(call, alice):
    granted = ["tasks.search"]
    outcome = call("tasks.create", {"title": "sneaky"}, granted=granted)
    assert (outcome.ok, outcome.error_kind) == (False, "not_granted")
    assert not alice.tasks.exists()
    assert call("tasks.search", {}, granted=granted).ok
