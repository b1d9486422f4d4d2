"""An event's payload for people: a key/value table instead of a Python repr.

Scalars read as words (yes/no, a dash for nothing), nested values as indented JSON,
sizes in bytes as "1.2 KB". A skill call's arguments get the rows a person looks for
first: an email's To, Subject and Body; a file's path and size. Every value is
escaped: payloads carry model output. And every value is cut at
ASSISTANT_OUTPUT_LIMITS["payload_value_chars"] with a note of how much was left out: a
file's content or an email's body can be a megabyte, and the table is for reading.
"""

from __future__ import annotations

import html
import json

from django.template.defaultfilters import filesizeformat
from django.utils.safestring import SafeString, mark_safe

from orchestration.records.output import json_unwrapped, output_limit, text_bounded

EMAIL_ROWS = (("to", "To"), ("subject", "Subject"), ("body", "Body"))


def render_payload(payload) -> SafeString:
    if payload in (None, "", {}, []):
        return mark_safe("")  # noqa: S308  # nosec - a constant
    if not isinstance(payload, dict):
        return html_format('<pre class="payload">{}</pre>', _json(payload))
    rows = []
    arguments = payload.get("arguments")
    skill = payload.get("skill")
    for key, value in payload.items():
        if key == "arguments" and isinstance(arguments, dict) and isinstance(skill, str):
            rows.extend(_skill_rows(skill, arguments))
        else:
            rows.append((_label(key), _value(key, value)))
    body = "".join(html_format("<tr><th>{}</th><td>{}</td></tr>", label, value) for label, value in rows)
    return html_format('<table class="payload"><tbody>{}</tbody></table>', mark_safe(body))  # noqa: S308  # nosec - rows escaped


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
        rows.append(("Path", html_format("<code>{}</code>", _bounded(str(arguments["path"])))))
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
    return html_format("<pre>{}</pre>", _json(json_unwrapped(value)))


def _text(text: str) -> SafeString:
    return html_format('<span class="text">{}</span>', _bounded(text))


def _json(value) -> str:
    return _bounded(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _bounded(text: str) -> str:
    return text_bounded(text, limit=output_limit("payload_value_chars"))


def html_format(template: str, *values) -> SafeString:
    """format_html for the live page's hot path: each value escaped as conditional_escape
    escapes it (HTML already safe kept as it is), the same output, without Django's
    lazy-string wrappers around every call. A row and its payload are a dozen values,
    built once per event for every socket; through format_html they were most of a row's
    CPU (a profile of daphne under `make load`)."""
    return mark_safe(template.format(*(  # noqa: S308  # nosec - every value escaped here
        value.__html__() if hasattr(value, "__html__") else html.escape(str(value)) for value in values)))
