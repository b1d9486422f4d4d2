"""Model output becomes HTML only through markdown + nh3: nothing executable survives."""

from html.parser import HTMLParser

import pytest

from assistant.rendering import ALLOWED_TAGS, render_markdown

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[click](javascript:alert(1))",
    "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    '<a href="#" hx-get="/admin/" hx-trigger="load">x</a>',
    "<svg onload=alert(1)>",
    '<iframe src="https://evil.example"></iframe>',
    "![x](https://evil.example/track.png)",
    '<div style="background:url(javascript:alert(1))">x</div>',
    "<<script>script>alert(1)<</script>/script>",
    "[x](JaVaScRiPt:alert(1))",
    "[x](&#106;avascript:alert(1))",
    "<a href='vbscript:msgbox(1)'>x</a>",
    "[x](https://example.com \"title\" onclick=alert(1))",
]


class Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict]]:
    parser = Elements()
    parser.feed(html)
    return parser.found


@pytest.mark.parametrize("text", HOSTILE)
def test_nothing_executable_survives(text):
    for tag, attrs in elements(render_markdown(text)):
        assert tag in ALLOWED_TAGS
        assert set(attrs) <= {"href", "title", "rel"}
        href = (attrs.get("href") or "").strip().lower()
        assert not href or href.startswith(("http://", "https://", "mailto:")), href


def test_formatting_survives():
    html = render_markdown("**bold** and [a link](https://example.com)\n\n- one\n- two")
    assert "<strong>bold</strong>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">a link</a>' in html
    assert "<li>one</li>" in html
