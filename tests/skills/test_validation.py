"""validate_arguments: readable problems, never an exception."""

from __future__ import annotations

import pytest

from skills.registry import get_skill
from skills.validation import nested_too_deep, validate_arguments


def problems(skill: str, arguments) -> list[str]:
    return validate_arguments(get_skill(skill), arguments)


def test_valid_arguments_have_no_problems():
    assert problems("tasks.create", {"title": "Buy milk", "due": "2025-03-01"}) == []


@pytest.mark.parametrize(
    ("skill", "arguments", "expected"),
    [
        ("tasks.create", {}, "missing required field 'title'"),
        (
            "tasks.create",
            {"title": "x", "foo": 1},
            "unexpected field 'foo' (allowed: due, notes, title)",
        ),
        ("tasks.create", {"title": 7}, "'title' must be a string"),
        ("tasks.create", {"title": ""}, "'title' must not be empty"),
        ("tasks.create", {"title": "x" * 201}, "'title' must be at most 200 characters (got 201)"),
        (
            "tasks.create",
            {"title": "a\nb"},
            "'title' must be one line, without control characters or line breaks: "
            "it holds U+000A LINE FEED at character 2",
        ),
        (
            "tasks.create",
            {"title": "x", "due": "tomorrow"},
            "'due' must be a string in YYYY-MM-DD format",
        ),
        (
            "tasks.create",
            {"title": "x", "due": "2025-02-30"},
            "'due' must be a string in YYYY-MM-DD format",
        ),
        ("tasks.update", {"task_id": "12"}, "'task_id' must be an integer"),
        ("tasks.update", {"task_id": True}, "'task_id' must be an integer"),
        ("tasks.update", {"task_id": 0}, "'task_id' must be at least 1"),
        ("tasks.update", {"task_id": 1, "due": 5}, "'due' must be a string or null"),
        ("tasks.search", {"status": "closed"}, '\'status\' must be one of "open", "done"'),
        ("tasks.search", {"overdue": "yes"}, "'overdue' must be true or false"),
        ("tasks.search", {"limit": 51}, "'limit' must be at most 50"),
        (
            "calendar.create_event",
            {"title": "x", "start": "next monday"},
            "'start' must be an ISO 8601 date-time string such as 2025-03-01T09:30:00+00:00",
        ),
        (
            "email.send",
            {"to": ["sam@example.com", "nope"], "subject": "s", "body": "b"},
            "'to[1]' must be a valid email address",
        ),
        ("email.send", {"to": [], "subject": "s", "body": "b"}, "'to' must have at least 1 item"),
        (
            "email.send",
            {"to": ["a@example.com"] * 2, "subject": "s", "body": "b"},
            "'to' must not repeat items",
        ),
        (
            "email.send",
            {"to": "sam@example.com", "subject": "s", "body": "b"},
            "'to' must be an array",
        ),
        (
            "memory.save",
            {"text": "x", "tags": ["ok", "not ok"]},
            """'tags[1]' does not match "^[A-Za-z0-9_-]+$": A tag: letters, digits, - and _.""",
        ),
        ("tasks.search", [], "arguments must be an object"),
        ("tasks.search", None, "arguments must be an object"),
        ("tasks.search", {"text": object()}, "arguments must be plain JSON"),
    ],
)
def test_problems_read_like_sentences(skill, arguments, expected):
    assert expected in problems(skill, arguments)


def test_every_problem_is_reported():
    assert problems("email.send", {"to": ["x"], "subject": 3, "cc": []}) == [
        "missing required field 'body'",
        "unexpected field 'cc' (allowed: body, subject, to)",
        "'subject' must be a string",
        "'to[0]' must be a valid email address",
    ]


def test_the_whole_payload_is_capped(settings):
    settings.SKILLS_MAX_ARGUMENT_BYTES = 50
    assert problems("memory.save", {"text": "é" * 30}) == [
        "arguments are 71 bytes of JSON; the limit is 50"
    ]


def nested(depth: int, leaf: object = "x") -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@pytest.mark.parametrize(
    ("value", "depth"),
    [("x", 0), ({}, 1), ({"a": 1}, 1), ({"a": [1]}, 2), ([[[]]], 3), ({"a": nested(31)}, 32),
     ({"a": "x", "b": [{"c": nested(30)}]}, 33), ({"a": nested(5000)}, 5001)],
)
def test_nesting_is_measured_without_recursion(value, depth):
    assert nested_too_deep(value, limit=depth) is False
    assert nested_too_deep(value, limit=depth - 1) is (depth > 0)


def test_arguments_nested_past_the_cap_are_one_clear_problem():
    assert problems("memory.save", {"text": nested(32)}) == ["arguments nest more than 32 levels deep"]
    assert problems("memory.save", {"text": nested(31)}) == ["'text' must be a string"]
