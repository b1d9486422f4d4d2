"""An event's payload in the timeline: a key/value table a person can read, escaped."""

from html.parser import HTMLParser

import pytest
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy

from assistant.payloads import html_format, render_payload


class Cells(HTMLParser):
    """The table's rows as (header, cell text) pairs, and every tag seen."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("th", "td"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def cells(payload) -> Cells:
    parser = Cells()
    parser.feed(str(render_payload(payload)))
    return parser


def test_scalars_read_as_words_not_python_reprs():
    rows = cells({"ok": True, "retry": False, "error": None, "duration_ms": 12, "finish_reason": "stop"}).rows
    assert rows == [["Ok", "yes"], ["Retry", "no"], ["Error", "—"], ["Duration ms", "12"],
                    ["Finish reason", "stop"]]


def test_nested_values_are_indented_json():
    html = str(render_payload({"usage": {"prompt_tokens": 3, "cached": None}, "tool_calls": ["tasks.search"]}))
    assert '<pre>{\n  &quot;prompt_tokens&quot;: 3,\n  &quot;cached&quot;: null\n}</pre>' in html
    assert '<pre>[\n  &quot;tasks.search&quot;\n]</pre>' in html


def test_an_email_shows_to_subject_and_body():
    rows = cells({"skill": "email.send", "arguments": {
        "body": "Hi Bob,\nsee you at 3.", "subject": "Friday", "to": ["bob@example.com", "carol@example.com"],
        "cc": ["dan@example.com"]}}).rows
    assert rows == [["Skill", "email.send"], ["To", "bob@example.com, carol@example.com"], ["Subject", "Friday"],
                    ["Body", "Hi Bob,\nsee you at 3."], ["Cc", '[\n  "dan@example.com"\n]']]


def test_a_file_shows_its_path_and_size():
    rows = cells({"skill": "files.write", "arguments": {"path": "notes/week.md", "content": "é" * 600}}).rows
    assert rows[:3] == [["Skill", "files.write"], ["Path", "notes/week.md"], ["Size", "1.2\xa0KB"]]
    assert cells({"skill": "files.read", "arguments": {"path": "a.txt"}}).rows == [["Skill", "files.read"],
                                                                                    ["Path", "a.txt"]]
    assert cells({"path": "a.txt", "size_bytes": 10}).rows == [["Path", "a.txt"], ["Size bytes", "10\xa0bytes"]]


HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"


@pytest.mark.parametrize("payload", [
    {"message": HOSTILE},
    {HOSTILE: "a key"},
    {"nested": {"deep": [HOSTILE]}},
    {"skill": "email.send", "arguments": {"to": [HOSTILE], "subject": HOSTILE, "body": HOSTILE}},
    {"skill": "files.write", "arguments": {"path": HOSTILE, "content": HOSTILE}},
    {"skill": HOSTILE, "arguments": {HOSTILE: HOSTILE}},
    [HOSTILE],
    HOSTILE,
])
def test_everything_is_escaped(payload):
    parsed = cells(payload)
    assert set(parsed.tags) <= {"table", "tbody", "tr", "th", "td", "pre", "span", "code"}
    assert "<script>" not in str(render_payload(payload))


def test_an_empty_payload_renders_nothing():
    assert render_payload({}) == "" and render_payload(None) == ""


@pytest.mark.parametrize("value", [
    HOSTILE, "\"quoted\" & 'single'", mark_safe("<em>already safe</em>"), gettext_lazy("Lazy <text>"),
    12, None, 1.5, ["<list>"], "",
])
def test_html_format_escapes_as_format_html_does(value):
    """The rows' and payloads' faster formatter gives format_html's output byte for byte:
    values escaped, HTML already marked safe kept, lazy text resolved."""
    template = "<td>{}</td><th title=\"{}\">{}</th>"
    assert html_format(template, value, value, "<x>") == format_html(template, value, value, "<x>")
    assert isinstance(html_format(template, value, value, "<x>"), SafeString)
