"""No argument a user or a model can send makes a skill raise anything but a SkillError.

For every registered skill, hypothesis draws arguments from the skill's own JSON Schema
(hypothesis-jsonschema), then swaps some fields for hostile values: dates at the ends of
the calendar, offsets that overflow, line breaks and separators, NUL, paths that climb,
absurd numbers. Each call goes through the real executor on the real database; its
outcome must be a result or a refusal the model can read (invalid arguments, or a
SkillError's message), never "failed unexpectedly", and nothing may be logged as a crash.
The named cases below are the ones that used to crash.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st
from hypothesis_jsonschema import from_schema

from skills import registry

HOSTILE_STRINGS = [
    "", " ", ".", "..", "\\", "%", "_", "'; DROP TABLE skills_task; --",
    "\r\n", "\n", "\u2028", "\u2029", "\x85", "\x00", "\x1b[31m", "\u202e", "\ufeff",
    "9999-12-31", "0001-01-01", "9999-12-31T23:59", "9999-12-31T23:59:59.999999",
    "9999-12-31T23:59:59-14:00", "9999-12-31T23:59+00:00", "0001-01-01T00:00",
    "0001-01-01T00:00+14:00", "0001-01-01T00:00:00-23:59", "2026-03-29T02:30",
    "2026-11-25T14:00", "2026-11-25T14:00:00+05:45", "2026-11-25T14:00+16:00", "20261125T140000Z", "2026-W48-3",
    "a@b", "a@b.c", '"a b"@example.com', '"a\\"b"@example.com', "a@[127.0.0.1]",
    "bob@example.com\r\nBcc: eve@example.com", "=?utf-8?q?x?=@example.com",
    "é@exämple.com", "x" * 64 + "@" + "y" * 63 + ".com",
    "../../etc/passwd", "/etc/passwd", "a/" * 200 + "b", "~", "-", "con", "a" * 255,
    "\u00e9" * 200, "😀" * 50,
]
HOSTILE_NUMBERS = [0, -1, 1, 59, 10080, 10081, 2**31, 2**63 - 1, 2**63, 10**30, -(2**63)]


def hostile_value(schema: dict):
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    options = [st.sampled_from(HOSTILE_STRINGS)]
    if "integer" in kinds:
        options.append(st.sampled_from(HOSTILE_NUMBERS))
    if "array" in kinds:
        options.append(st.lists(st.sampled_from(HOSTILE_STRINGS), min_size=1, max_size=3))
    return st.one_of(options)


@st.composite
def hostile_arguments(draw, skill):
    """Arguments for `skill` drawn from its schema, some fields swapped for hostile values.

    Field by field: hypothesis-jsonschema's strategy for a whole object relies on a
    Hypothesis internal that Hypothesis 6.170 changed; every skill's parameters are a
    closed object of plain properties, so the object is assembled here and each value is
    drawn from its own property schema (formats, patterns and bounds included)."""
    parameters = skill.parameters
    required = set(parameters.get("required", ()))
    arguments = {}
    for field, schema in parameters["properties"].items():
        if field not in required and draw(st.booleans()):
            continue
        hostile = draw(st.integers(0, 2)) == 0
        arguments[field] = draw(hostile_value(schema) if hostile else from_schema(schema))
    return arguments


def assert_answered(outcome, caplog) -> None:
    """A result, or a refusal the model can read: never a crash."""
    assert outcome.ok or outcome.error_kind in ("invalid_arguments", "failed"), outcome
    assert "unexpectedly" not in outcome.error, outcome.error
    crashes = [r for r in caplog.records if r.name == "skills.executor" and r.levelno >= logging.ERROR]
    assert not crashes, crashes[0].getMessage()


@pytest.mark.parametrize("name", registry.skill_names())
@hypothesis_settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_skill_answers_whatever_it_is_sent(call, caplog, name, data):
    skill = registry.get_skill(name)
    arguments = data.draw(hostile_arguments(skill), label="arguments")
    assert_answered(call(name, arguments), caplog)


CASES = [
    # Dates at the ends of the calendar: OverflowError once shifted by an offset or a duration.
    ("calendar.create_event", {"title": "Forever", "start": "9999-12-31T23:59", "duration_minutes": 10080},
     "'start' is out of range"),
    ("calendar.create_event", {"title": "Late", "start": "8999-12-31T23:59", "duration_minutes": 10080},
     "the event's end would be out of range"),
    ("calendar.create_event", {"title": "Early", "start": "0001-01-01T00:00+14:00"}, "'start' is out of range"),
    ("calendar.create_event", {"title": "Early", "start": "0001-01-01T00:00"}, "'start' is out of range"),
    # An offset Python reads and PostgreSQL refuses in the INSERT (found by the property test).
    ("calendar.create_event", {"title": "Far east", "start": "2000-01-01T00:00+16:00"},
     "'start' has a UTC offset beyond ±14:00"),
    ("calendar.list_events", {"start": "2000-01-01T00:00-23:59"}, "'start' has a UTC offset beyond ±14:00"),
    ("calendar.list_events", {"start": "9999-12-31T00:00"}, "'start' is out of range"),
    ("calendar.list_events", {"start": "8999-12-31T00:00"}, "the default 'end' would be out of range"),
    ("calendar.list_events", {"start": "2026-01-01T00:00", "end": "9999-12-31T23:59:59-14:00"},
     "'end' is out of range"),
    # Aware and naive mixed: both read in the user's zone, then compared.
    ("calendar.list_events", {"start": "2026-01-02T00:00+00:00", "end": "2026-01-01T00:00"},
     "'end' must be after 'start'"),
    # Addresses Django's validator lets through, that no mail header can carry.
    ("email.send", {"to": ['"a\\"b c"@example.com'], "subject": "Hi", "body": "Hello"}, None),
    ("email.send", {"to": ["é@exämple.com"], "subject": "Hi", "body": "Hello"}, None),
    ("email.send", {"to": ["bob@example.com"], "subject": "x" * 300, "body": "Hello"}, None),
    # The longest header the schema allows: 20 addresses of 254 characters each.
    ("email.send", {"to": [f"{n:02d}{'a' * 62}@{'b' * 63}.{'c' * 63}.{'d' * 57}.com" for n in range(20)],
                    "subject": "Wide", "body": "Hello"}, None),
    ("email.send", {"to": ["bob@example.com"], "subject": "\u00e9" * 300, "body": "\u2028" * 5000}, None),
    # Paths: a file where a folder must be, a folder where a file must be.
    ("files.write", {"path": "a" * 255 + "/" + "b" * 255 + "/" + "c" * 255 + "/" + "d" * 250, "content": "x"}, None),
    ("files.read", {"path": "."}, "names a directory"),
    ("files.list", {"path": "~"}, "not found"),
]


@pytest.mark.parametrize(("name", "arguments", "error"), CASES, ids=[f"{n}: {str(a)[:60]}" for n, a, _ in CASES])
def test_inputs_that_used_to_crash_are_answered(call, caplog, name, arguments, error):
    outcome = call(name, arguments)
    assert_answered(outcome, caplog)
    if error is not None:
        assert (outcome.ok, outcome.error_kind) == (False, "failed") and error in outcome.error, outcome


def test_a_file_where_a_folder_must_be_is_refused(call, ok, caplog):
    ok("files.write", {"path": "notes", "content": "a file"})
    for arguments in ({"path": "notes/today.md", "content": "x"}, {"path": "notes/"}):
        outcome = call("files.write" if "content" in arguments else "files.list", arguments)
        assert_answered(outcome, caplog)
        assert not outcome.ok
