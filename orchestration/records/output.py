"""How much text the product keeps for show and renders (issue 18).

A 1 MB model answer made its page take 15 s to render and slowed everyone else's: the
chat message, every page view and every live push ran it through markdown and the
sanitiser. So the answer stored as the chat message, any text rendered for a page and
each value of a payload table end, past their cap (settings.ASSISTANT_OUTPUT_LIMITS), in
a visible note that says how much was left out. The model's whole response stays in the
turn's stored LLM call (the audit trail and the replay of a crashed step need it as it
was), until retention ages it out.
"""

from __future__ import annotations

import json

from django.conf import settings


def output_limit(name: str) -> int:
    """"answer_chars", "rendered_chars" or "payload_value_chars"."""
    return settings.ASSISTANT_OUTPUT_LIMITS[name]


def truncation_note(cut: int) -> str:
    return f"…(truncated, {cut:,} characters)"


def text_bounded(text: str, *, limit: int) -> str:
    """`text`, or its start and the note, `limit` characters at most in all."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(truncation_note(len(text))) - 2)
    return f"{text[:keep]}\n\n{truncation_note(len(text) - keep)}"


def json_unwrapped(value):
    """`value` with the JSON text inside it decoded: a tool call's arguments are a JSON
    string, which shown as JSON again reads as one escaped line ("{\\"to\\": …")."""
    if isinstance(value, dict):
        return {key: json_unwrapped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_unwrapped(item) for item in value]
    if isinstance(value, str) and value[:1] in "{[" and value[-1:] in "}]":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
