"""One-line fields — titles, subjects, recipients, file names — refuse every control
character and line or paragraph separator, with a problem naming the field and the
character, before any handler runs (skills/validation.py, ONE_LINE).

The fields are found in the registered skills' schemas, so a new one-line field is
covered as soon as it is declared with `schema.text(..., one_line=True)`.
"""

from __future__ import annotations

import pytest
from django.core import mail

from skills import registry
from skills.models import CalendarEvent, Memory, OutboxEmail, Task
from skills.validation import ONE_LINE
from tests.skills.test_arguments import VALID

BREAKING = {
    "LF": "\n",
    "CR": "\r",
    "CRLF header injection": "\r\nBcc: everyone@example.com",
    "trailing LF": "\n",  # at the end: Python's `$` let it through
    "TAB": "\t",
    "ESC": "\x1b",
    "DEL": "\x7f",
    "NEXT LINE U+0085": "\x85",
    "CSI U+009B": "\x9b",
    "LINE SEPARATOR U+2028": "\u2028",
    "PARAGRAPH SEPARATOR U+2029": "\u2029",
}


def one_line_fields():
    """(skill, field, is it an array of them) for every one-line field of every skill."""
    for skill in registry.all_skills():
        for field, schema in skill.parameters["properties"].items():
            if schema.get("pattern") == ONE_LINE:
                yield skill.name, field, False
            elif schema.get("items", {}).get("pattern") == ONE_LINE:
                yield skill.name, field, True


FIELDS = list(one_line_fields())


def test_the_fields_a_user_would_call_one_line_are():
    assert {(skill, field) for skill, field, _ in FIELDS} >= {
        ("tasks.create", "title"), ("tasks.update", "title"), ("calendar.create_event", "title"),
        ("calendar.create_event", "invitees"), ("email.send", "subject"), ("email.send", "to"),
        ("email.search_sent", "recipient"), ("files.write", "path"), ("files.read", "path"),
        ("files.append", "path"), ("files.list", "path"),
    }


def hostile(value: str, breaking: str, name: str) -> str:
    if name == "trailing LF":
        return value + breaking
    if "@" in value:  # an address: inside its local part
        local, _, domain = value.partition("@")
        return f"{local}{breaking}x@{domain}"
    return f"a{breaking}b" + value


@pytest.mark.parametrize("name", list(BREAKING))
@pytest.mark.parametrize(("skill", "field", "array"), FIELDS, ids=[f"{s}.{f}" for s, f, _ in FIELDS])
def test_a_line_breaking_character_is_refused_naming_the_field(call, workspace, skill, field, array, name):
    valid = VALID[skill]
    example = {"to": ["sam@example.com"], "invitees": ["sam@example.com"]}.get(field) or valid.get(field) or "x.txt"
    if array:
        value = [hostile(example[0], BREAKING[name], name)]
        where = f"'{field}[0]'"
    else:
        value = hostile(example, BREAKING[name], name)
        where = f"'{field}'"
    outcome = call(skill, {**valid, field: value})

    assert (outcome.ok, outcome.error_kind) == (False, "invalid_arguments")
    code = f"U+{ord(BREAKING[name][0]):04X}"
    assert any(
        problem.startswith(f"{where} must be one line, without control characters or line breaks: it holds {code}")
        for problem in outcome.problems
    ), outcome.problems
    for model in (Task, CalendarEvent, OutboxEmail, Memory):
        assert not model.objects.exists()
    assert mail.outbox == []
    assert not workspace.exists()


def test_format_characters_stay_allowed(ok):
    """The zero-width joiner builds emoji; the direction marks belong in Hebrew and Arabic."""
    title = "Family 👨\u200d👩\u200d👧 dinner with \u200fשרה\u200e"
    assert ok("tasks.create", {"title": title})["task"]["title"] == title


def test_a_memory_tag_with_a_trailing_newline_is_refused(call):
    """JSON Schema patterns end at the end of the text, whatever Python's `$` says."""
    outcome = call("memory.save", {"text": "Sam likes jazz", "tags": ["music\n"]})
    assert outcome.error_kind == "invalid_arguments"
    assert outcome.problems[0].startswith("'tags[0]' does not match")
    assert not Memory.objects.exists()
