"""Every skill refuses every kind of bad argument before its handler runs.

The cases are generated from each skill's own schema, so a new skill or parameter is
covered as soon as it gets an entry in VALID (a test below insists that it does).
"""

from __future__ import annotations

import pytest
from django.core import mail

from orchestration.models import SkillExecution
from skills import registry
from skills.models import CalendarEvent, Memory, OutboxEmail, Task
from skills.validation import validate_arguments

VALID = {  # one valid call per skill
    "tasks.search": {},
    "tasks.create": {"title": "Buy milk"},
    "tasks.update": {"task_id": 1, "title": "Buy oat milk"},
    "tasks.complete": {"task_id": 1},
    "calendar.list_events": {},
    "calendar.create_event": {"title": "Lunch", "start": "2025-03-01T12:00:00+00:00"},
    "calendar.cancel_event": {"event_id": 1},
    "email.send": {"to": ["sam@example.com"], "subject": "Hi", "body": "Hello"},
    "email.search_sent": {},
    "memory.save": {"text": "Sam likes jazz"},
    "memory.search": {"query": "jazz"},
    "files.list": {},
    "files.read": {"path": "notes.txt"},
    "files.write": {"path": "notes.txt", "content": "hello"},
    "files.append": {"path": "notes.txt", "content": "hello"},
}
WRONG_TYPE = {"string": 12345, "integer": "12", "boolean": "yes", "array": "a", "number": "1"}


def _types(schema: dict) -> list[str]:
    kind = schema["type"]
    return [kind] if isinstance(kind, str) else kind


def _too_many(schema: dict, count: int) -> list:
    if schema["items"].get("format") == "email":
        return [f"person{i}@example.com" for i in range(count)]
    return [f"item{i}" for i in range(count)]


def bad_cases():
    """(skill, arguments, a phrase the problems must contain)."""
    for skill in registry.all_skills():
        valid = VALID[skill.name]
        yield skill.name, "extra field", {**valid, "bogus": 1}, "unexpected field 'bogus'"
        yield skill.name, "not an object", ["bogus"], "arguments must be an object"
        yield skill.name, "oversized payload", {**valid, "bogus": "x" * 70_000}, "the limit is"
        for field in skill.parameters.get("required", []):
            missing = {k: v for k, v in valid.items() if k != field}
            yield skill.name, f"missing {field}", missing, f"missing required field '{field}'"
        for field, schema in skill.parameters["properties"].items():
            wrong = WRONG_TYPE[_types(schema)[0]]
            yield skill.name, f"{field} wrong type", {**valid, field: wrong}, f"'{field}' must be"
            if "maxLength" in schema and schema["maxLength"] < 60_000:
                long = "x" * (schema["maxLength"] + 1)
                yield skill.name, f"{field} too long", {**valid, field: long}, "at most"
            if schema.get("minLength"):
                yield skill.name, f"{field} empty", {**valid, field: ""}, "must not be empty"
            if "maxItems" in schema:
                many = _too_many(schema, schema["maxItems"] + 1)
                yield skill.name, f"{field} too many", {**valid, field: many}, "at most"
            if "maximum" in schema:
                big = schema["maximum"] + 1
                yield skill.name, f"{field} too big", {**valid, field: big}, "at most"
            if "minimum" in schema:
                small = schema["minimum"] - 1
                yield skill.name, f"{field} too small", {**valid, field: small}, "at least"
            if "enum" in schema:
                yield skill.name, f"{field} not a choice", {**valid, field: "bogus"}, "one of"
            if "format" in schema:
                yield skill.name, f"{field} bad format", {**valid, field: "bogus"}, "must be a"


CASES = list(bad_cases())


def test_every_skill_has_a_valid_example():
    assert sorted(VALID) == registry.skill_names()
    for name, arguments in VALID.items():
        assert validate_arguments(registry.get_skill(name), arguments) == [], name


@pytest.mark.parametrize(
    ("skill", "arguments", "expected"),
    [(skill, arguments, expected) for skill, _case, arguments, expected in CASES],
    ids=[f"{skill}: {case}" for skill, case, _arguments, _expected in CASES],
)
def test_bad_arguments_are_refused_before_the_handler(call, workspace, skill, arguments, expected):
    outcome = call(skill, arguments)
    assert (outcome.ok, outcome.error_kind) == (False, "invalid_arguments")
    assert any(expected in problem for problem in outcome.problems), outcome.problems
    assert SkillExecution.objects.get().status == "failed"
    for model in (Task, CalendarEvent, OutboxEmail, Memory):
        assert not model.objects.exists()
    assert mail.outbox == []
    assert not workspace.exists()
