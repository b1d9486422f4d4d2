"""Model output to HTML: markdown first, then nh3 as the last word on what survives.

markdown-it runs with raw HTML disabled; nh3 then allows only formatting tags, only
http(s)/mailto links, and no attributes beyond href/title — so no script, no event
handlers, no javascript:/data: URLs and no hx-* attributes reach the page.

A text longer than ASSISTANT_OUTPUT_LIMITS["rendered_chars"] is rendered up to the cap,
followed by a note of how much was left out (orchestration/records/output.py). And what was
rendered is kept, per process, keyed by a hash of the text and RENDERER_VERSION: a stored
message never changes, so a page view or a live push shows the HTML rendered the first
time instead of running markdown and nh3 again over the whole chat. A hash rather than
the message's id: any text can be rendered (a result, a note) and a changed text can
never be served stale HTML. A cache rather than a column filled when the message is
written: the engine (orchestration) cannot call the web layer's renderer, the HTML
would have to be rewritten for every stored message whenever the renderer changes, and
the cache costs no migration. It is bounded by the size of the HTML it holds
(ASSISTANT_RENDERED_CACHE_CHARS), not by a count, since one entry can be 100 KB.
"""

from __future__ import annotations

import hashlib
import threading

import nh3
from cachetools import LRUCache
from django.conf import settings
from django.utils.html import format_html
from markdown_it import MarkdownIt

from orchestration.records.output import output_limit, truncation_note

# Bump when the markdown options or the allow-lists below change: cached HTML is keyed by it.
RENDERER_VERSION = 1

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


def render_markdown(text: str, *, cached: bool = True) -> str:
    """Sanitised HTML for `text`; `cached=False` for a text seen once (a streaming draft),
    which would only push the kept answers out of the cache."""
    text = text or ""
    if not cached:
        return _render(text)
    key = (RENDERER_VERSION, output_limit("rendered_chars"), hashlib.blake2b(text.encode(), digest_size=16).digest())
    cache = _cache()
    with _lock:
        html = cache.get(key)
    if html is None:
        html = _render(text)
        with _lock:
            try:
                cache[key] = html
            except ValueError:  # larger than the whole cache: rendered, not kept
                pass
    return html


_lock = threading.Lock()
_caches: dict[int, LRUCache] = {}


def _cache() -> LRUCache:
    size = settings.ASSISTANT_RENDERED_CACHE_CHARS
    with _lock:
        if size not in _caches:  # one per size: tests change it
            _caches.clear()
            _caches[size] = LRUCache(maxsize=size, getsizeof=len)
        return _caches[size]


def _render(text: str) -> str:
    limit = output_limit("rendered_chars")
    if len(text) <= limit:
        return _clean(text)
    kept = text[:limit]
    return _clean(kept) + format_html('<p class="truncated muted">{}</p>', truncation_note(len(text) - len(kept)))


def _clean(text: str) -> str:
    return nh3.clean(
        _markdown.render(text),
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        attribute_filter=_absolute_links_only,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
