"""Builders for the JSON Schemas of skill parameters.

Every object they build is closed (additionalProperties false) and every string and
array bounded, so validation alone keeps a model's arguments small and well-formed.
"""

from __future__ import annotations

from skills.validation import ONE_LINE

ID_MAX = 2**63 - 1  # a BigAutoField


def params(properties: dict, *, required: tuple[str, ...] = ()) -> dict:
    schema: dict = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def text(description: str, *, max_length: int, min_length: int = 0, one_line: bool = False) -> dict:
    schema: dict = {"type": "string", "description": description, "maxLength": max_length}
    if min_length:
        schema["minLength"] = min_length
    if one_line:
        schema["description"] += " One line."
        schema["pattern"] = ONE_LINE  # no control character or line break (skills/validation.py)
    return schema


def integer(description: str, *, minimum: int, maximum: int, default: int | None = None) -> dict:
    schema: dict = {
        "type": "integer",
        "description": description,
        "minimum": minimum,
        "maximum": maximum,
    }
    if default is not None:
        schema["default"] = default
    return schema


def record_id(noun: str) -> dict:
    return integer(f"The {noun}'s id.", minimum=1, maximum=ID_MAX)


def boolean(description: str) -> dict:
    return {"type": "boolean", "description": description}


def choice(description: str, values: list[str]) -> dict:
    return {"type": "string", "description": description, "enum": values}


def date(description: str, *, nullable: bool = False) -> dict:
    return {
        "type": ["string", "null"] if nullable else "string",
        "description": f"{description} (YYYY-MM-DD)",
        "format": "date",
        "maxLength": 10,
    }


def datetime(description: str) -> dict:
    return {
        "type": "string",
        "description": f"{description} (ISO 8601, e.g. 2025-03-01T09:30:00+01:00; "
        "without an offset: the user's time zone)",
        "format": "date-time",
        "maxLength": 40,
    }


def emails(description: str, *, max_items: int, min_items: int = 0) -> dict:
    schema: dict = {
        "type": "array",
        "description": description,
        "items": {"type": "string", "format": "email", "maxLength": 254, "pattern": ONE_LINE},
        "maxItems": max_items,
        "uniqueItems": True,
    }
    if min_items:
        schema["minItems"] = min_items
    return schema
