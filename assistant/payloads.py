"""An event's payload for people: a key/value table instead of a Python repr.

Scalars read as words (yes/no, a dash for nothing), nested values as indented JSON,
sizes in bytes as "1.2 KB". A skill call's arguments get the rows a person looks for
first: an email's To, Subject and Body; a file's path and size. Every value is
escaped (format_html): payloads carry model output. And every value is cut at
ASSISTANT_OUTPUT_LIMITS["payload_value_chars"] with a note of how much was left out: a
file's content or an email's body can be a megabyte, and the table is for reading.
"""

from __future__ import annotations

import json

from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from orchestration.records.output import json_unwrapped, output_limit, text_bounded

EMAIL_ROWS = (("to", "To"), ("subject", "Subject"), ("body", "Body"))


def render_payload(payload) -> SafeString:
    if payload in (None, "", {}, []):
        return mark_safe("")  # noqa: S308  # nosec - a constant
    if not isinstance(payload, dict):
        return format_html('<pre class="payload">{}</pre>', _json(payload))
    rows = []
    arguments = payload.get("arguments")
    skill = payload.get("skill")
    for key, value in payload.items():
        if key == "arguments" and isinstance(arguments, dict) and isinstance(skill, str):
            rows.extend(_skill_rows(skill, arguments))
        else:
            rows.append((_label(key), _value(key, value)))
    return format_html('<table class="payload"><tbody>{}</tbody></table>',
                       format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows))


def _skill_rows(skill: str, arguments: dict) -> list[tuple[str, SafeString]]:
    """The friendly rows first, then the arguments they did not cover."""
    rows, shown = [], set()
    if skill == "email.send":
        for key, label in EMAIL_ROWS:
            if key in arguments:
                value = arguments[key]
                if key == "to" and isinstance(value, list) and all(isinstance(v, str) for v in value):
                    value = ", ".join(value)
                rows.append((label, _value(key, value)))
                shown.add(key)
    elif skill.startswith("files.") and "path" in arguments:
        rows.append(("Path", format_html("<code>{}</code>", _bounded(str(arguments["path"])))))
        shown.add("path")
        content = arguments.get("content")
        if isinstance(content, str):
            rows.append(("Size", _text(filesizeformat(len(content.encode())))))
    rows.extend((_label(key), _value(key, value)) for key, value in arguments.items() if key not in shown)
    return rows


def _label(key) -> str:
    text = str(key).replace("_", " ")
    return text[:1].upper() + text[1:]


def _value(key, value) -> SafeString:
    if value is None:
        return mark_safe('<span class="muted">—</span>')  # noqa: S308  # nosec - a constant
    if isinstance(value, bool):
        return _text("yes" if value else "no")
    if isinstance(value, (int, float)) and str(key).endswith("size_bytes"):
        return _text(filesizeformat(value))
    if isinstance(value, (int, float, str)):
        return _text(str(value))
    return format_html("<pre>{}</pre>", _json(json_unwrapped(value)))


def _text(text: str) -> SafeString:
    return format_html('<span class="text">{}</span>', _bounded(text))


def _json(value) -> str:
    return _bounded(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _bounded(text: str) -> str:
    return text_bounded(text, limit=output_limit("payload_value_chars"))
