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
_LINK_PREFIXES = ("http://", "https://", "mailto:")


def _absolute_links_only(tag: str, attribute: str, value: str) -> str | None:
    """nh3's url_schemes vets absolute URLs only and lets relative ones through
    ("/admin/…", "//evil.example", "java%0Ascript:…"): inert, but not the promised
    "only http(s)/mailto links". The model must name a link's site outright."""
    if attribute == "href" and not value.lower().startswith(_LINK_PREFIXES):
        return None
    return value


def render_markdown(text: str) -> str:
    return nh3.clean(
        _markdown.render(text or ""),
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        attribute_filter=_absolute_links_only,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
