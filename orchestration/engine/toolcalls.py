"""Parsing what the model sent. Everything here is untrusted input."""

from __future__ import annotations

import json

from skills.validation import schema_problems

MAX_ARGUMENT_CHARS = 64_000


def load_json(raw: str) -> tuple[object, str]:
    """(value, "") or (None, why the text is not usable JSON).

    A few thousand nested brackets make json.loads raise RecursionError rather than a
    JSONDecodeError; uncaught, it would fail the whole step instead of answering the model.
    """
    try:
        return json.loads(raw or "{}"), ""
    except json.JSONDecodeError as exc:
        return None, f"arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    except RecursionError:
        return None, "arguments nest too deeply to be read"


def parse_arguments(raw: str, schema: dict) -> tuple[dict | None, str]:
    """(arguments, "") when valid, else (None, a message the model can act on)."""
    if len(raw or "") > MAX_ARGUMENT_CHARS:
        return None, f"arguments are {len(raw)} characters; the limit is {MAX_ARGUMENT_CHARS}."
    arguments, error = load_json(raw)
    if error:
        return None, f"{error}; send a JSON object."
    if not isinstance(arguments, dict):
        return None, "arguments must be a JSON object."
    problems = schema_problems(schema, arguments)
    if problems:
        return None, "invalid arguments: " + "; ".join(problems)
    return arguments, ""


def error_json(message: str, **extra) -> str:
    return json.dumps({"error": message, **extra})
