"""Argument validation: JSON Schema (Draft 2020-12) plus a cap on the whole payload.

The result is a list of short sentences an LLM can act on ("missing required field
'title'"), never an exception: bad arguments are the model's mistake to correct, not a
crash of the agent.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import date, datetime
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators

from skills.base import Skill

MAX_PROBLEMS = 20
# No skill's schema nests deeper than a few levels. Deeper arguments are refused before
# anything walks them recursively (size, text checks, JSON Schema, storing the row), where
# a few thousand levels would raise RecursionError and fail the whole agent instead of
# answering the model.
MAX_NESTING = 32

# What a one-line field (a title, a subject, a recipient, a file name) may not hold: every
# control character (Unicode Cc: C0 with CR, LF and TAB, DEL, C1 with U+0085 NEXT LINE)
# and the line and paragraph separators (Zl U+2028, Zp U+2029): each breaks a line
# somewhere — a mail header, a log, a terminal, a JSON-lines export. Format characters
# (Cf) stay allowed: the zero-width joiner builds emoji and the direction marks belong in
# Arabic and Hebrew names. The pattern is the schema's (the model reads it); its check
# is `_pattern`'s, and its refusal names the character (`one_line_problem`).
_BREAKING = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029"
ONE_LINE = f"^[^{_BREAKING}]*$"
_BREAKING_CHARACTER = re.compile(f"[{_BREAKING}]")
_CONTROL_NAMES = {"\t": "TAB", "\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\x00": "NUL",
                  "\x85": "NEXT LINE", "\x7f": "DELETE"}

# Only the formats our schemas use, checked with the same parsers the handlers use
# (jsonschema's own date-time check needs an extra package and is stricter than Python).
FORMATS = FormatChecker(formats=())


@FORMATS.checks("date", raises=ValueError)
def _is_date(value: object) -> bool:
    return not isinstance(value, str) or bool(date.fromisoformat(value))


@FORMATS.checks("date-time", raises=ValueError)
def _is_datetime(value: object) -> bool:
    return not isinstance(value, str) or bool(datetime.fromisoformat(value))


@FORMATS.checks("email", raises=DjangoValidationError)
def _is_email(value: object) -> bool:
    if isinstance(value, str):
        validate_email(value)
    return True


_TYPES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "an array",
    "object": "an object",
    "null": "null",
}
_FORMAT_NAMES = {
    "date": "a string in YYYY-MM-DD format",
    "date-time": "an ISO 8601 date-time string such as 2025-03-01T09:30:00+00:00",
    "email": "a valid email address",
}


def one_line_problem(text: str) -> str | None:
    """What keeps `text` from being one line ("U+2028 LINE SEPARATOR at character 4"),
    or None."""
    found = _BREAKING_CHARACTER.search(text)
    if found is None:
        return None
    char = found.group()
    name = _CONTROL_NAMES.get(char) or unicodedata.name(char, "a control character")
    return f"U+{ord(char):04X} {name} at character {found.start() + 1}"


@lru_cache(maxsize=256)
def _ecma_regex(pattern: str) -> re.Pattern:
    """A JSON Schema pattern (ECMA-262) as Python must read it: there, a final `$` is the
    end of the text; Python's `$` also matches before a final newline, so "Title\\n"
    passed `^[^\\r\\n]*$`."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.compile(pattern)


def _pattern(validator, pattern: str, instance, schema):
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def nested_too_deep(value: object, limit: int = MAX_NESTING) -> bool:
    """Whether lists/dicts in `value` nest more than `limit` levels (walked without recursion).

    `{"a": [1]}` nests 2 levels: after `limit` steps down, no list or dict may be left.
    """
    level = [value]
    for _ in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, (list, dict))
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, (list, dict)) for item in level)


def payload_size(arguments: object) -> int | None:
    """Bytes of the compact JSON encoding; None when it is not JSON at all."""
    try:
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    return len(text.encode(errors="surrogatepass"))


def unstorable_text(value: object) -> str | None:
    """Why some string in `value` cannot be stored, or None.

    JSON may carry NUL characters and unpaired surrogates ("\\u0000", "\\ud800");
    PostgreSQL refuses both in text and jsonb, so they must stop here, not in an INSERT.
    """
    if isinstance(value, str):
        if "\x00" in value:
            return "text must not contain NUL characters"
        try:
            value.encode()
        except UnicodeEncodeError:
            return "text must be valid Unicode (no unpaired surrogates)"
        return None
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list):
        return next(filter(None, map(unstorable_text, value)), None)
    return None


def validate_arguments(skill: Skill, arguments: object) -> list[str]:
    """Readable problems with `arguments` for `skill`; an empty list means valid."""
    if nested_too_deep(arguments):
        return [f"arguments nest more than {MAX_NESTING} levels deep"]
    size = payload_size(arguments)
    if size is None:
        return ["arguments must be plain JSON"]
    limit = settings.SKILLS_MAX_ARGUMENT_BYTES
    if size > limit:
        return [f"arguments are {size} bytes of JSON; the limit is {limit}"]
    text_problem = unstorable_text(arguments)
    if text_problem:
        return [f"arguments: {text_problem}"]
    return schema_problems(skill.parameters, arguments)


def schema_problems(schema: dict, arguments: object) -> list[str]:
    """Readable problems with `arguments` against any JSON Schema (tools' too)."""
    validator = Validator(schema, format_checker=FORMATS)
    errors = sorted(validator.iter_errors(arguments), key=_reading_order)
    problems: list[str] = []
    for error in errors:
        for problem in _describe(error):
            if problem not in problems:
                problems.append(problem)
    return problems[:MAX_PROBLEMS]


def _reading_order(error: ValidationError) -> tuple:
    """Field by field; at each level what is missing first, then what is extra."""
    return (error.json_path, error.validator != "required", error.validator)


def _describe(error: ValidationError) -> list[str]:
    where = _field(error)
    keyword, expected, value = error.validator, error.validator_value, error.instance
    if keyword == "required":
        prefix = f"{where[1:-1]}." if error.absolute_path else ""
        return [
            f"missing required field '{prefix}{name}'" for name in expected if name not in value
        ]
    if keyword == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return [f"unexpected field {name!r}{hint}" for name in sorted(value) if name not in allowed]
    if keyword == "type":
        names = [expected] if isinstance(expected, str) else expected
        return [f"{where} must be {' or '.join(_TYPES.get(n, n) for n in names)}"]
    if keyword == "format":
        return [f"{where} must be {_FORMAT_NAMES.get(expected, f'in {expected} format')}"]
    if keyword == "maxLength":
        return [f"{where} must be at most {expected} characters (got {len(value)})"]
    if keyword == "minLength":
        return [
            f"{where} must not be empty"
            if expected == 1
            else f"{where} must be at least {expected} characters"
        ]
    if keyword == "maxItems":
        return [f"{where} must have at most {expected} items (got {len(value)})"]
    if keyword == "minItems":
        return [f"{where} must have at least {expected} item{'s' if expected > 1 else ''}"]
    if keyword == "enum":
        return [f"{where} must be one of {', '.join(json.dumps(v) for v in expected)}"]
    if keyword == "minimum":
        return [f"{where} must be at least {expected}"]
    if keyword == "maximum":
        return [f"{where} must be at most {expected}"]
    if keyword == "uniqueItems":
        return [f"{where} must not repeat items"]
    if keyword == "pattern" and expected == ONE_LINE:
        return [f"{where} must be one line, without control characters or line breaks: "
                f"it holds {one_line_problem(value)}"]
    if keyword == "pattern":
        # The field's description says in words what the pattern says in symbols.
        meaning = error.schema.get("description")
        return [
            f"{where} does not match {json.dumps(expected)}" + (f": {meaning}" if meaning else "")
        ]
    return [f"{where}: {error.message}"]


def _field(error: ValidationError) -> str:
    """'due', 'to[2]' or 'arguments' for the top level."""
    if not error.absolute_path:
        return "arguments"
    text = ""
    for part in error.absolute_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return f"'{text}'"
