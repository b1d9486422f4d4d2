"""Model output to HTML: markdown first, then nh3 as the last word on what survives.

markdown-it runs with raw HTML disabled; nh3 then allows only formatting tags, only
http(s)/mailto links, and no attributes beyond href/title — so no script, no event
handlers, no javascript:/data: URLs and no hx-* attributes reach the page.
"""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")

ALLOWED_TAGS = {
    "p", "br", "strong", "em", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "h1", "h2", "h3", "h4", "hr", "table", "thead", "tbody", "tr", "th", "td",
}
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}}


def render_markdown(text: str) -> str:
    return nh3.clean(
        _markdown.render(text or ""),
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
