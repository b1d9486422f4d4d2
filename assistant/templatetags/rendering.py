from datetime import datetime
from functools import lru_cache

from django import template
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from assistant.payloads import render_payload
from assistant.rendering import render_markdown
from assistant.rows import event_row as _event_row
from orchestration.budgets.usage import Spend
from orchestration.questions.approvals import clearance_words, rule_offered
from orchestration.questions.pauses import PauseWords, pause_words_of
from orchestration.records.output import output_limit, text_bounded
from orchestration.reports.errors import failure_of
from orchestration.reports.selectors import state_words
from orchestration.reports.waterfall import duration_text
from orchestration.zones import is_picked_zone, time_zone_groups

register = template.Library()


@register.filter
def markdown(text: str) -> str:
    """Sanitised HTML from the model's markdown (see assistant/rendering.py)."""
    # bandit B308/B703 (mark_safe): the HTML is nh3's output from an allow-list of tags,
    # attributes and URL schemes, tested in tests/web/test_rendering.py.
    return mark_safe(render_markdown(text))  # noqa: S308  # nosec


@register.filter
def markdown_draft(text: str) -> str:
    """The same for a streaming answer's draft: rendered each time, not kept (each
    snapshot is seen once, and would push the stored answers out of the cache)."""
    return mark_safe(render_markdown(text, cached=False))  # noqa: S308  # nosec - as `markdown`


@register.filter
def bounded(text) -> str:
    """Plain text shown whole on a page (a skill's result, an email's body), cut at the
    payload value cap with the note saying how much was left out. Escaped as usual."""
    return text_bounded(str(text), limit=output_limit("payload_value_chars"))


def _spend(value) -> Spend:
    """Pages get a Spend; the audit view gets its JSON form (the export's)."""
    return value if isinstance(value, Spend) else Spend.from_json(value or {})


@register.filter
def cost(value) -> str:
    """A spend's cost as every page shows it ("$0.0123", "" when nothing had a price)."""
    return _spend(value).cost_text()


@register.filter
def spend(value) -> str:
    """A spend's tokens and cost: "1234 tokens · $0.0123"."""
    return _spend(value).summary()


@register.filter
def payload(value) -> str:
    """An event's payload as a key/value table (see assistant/payloads.py), escaped."""
    return render_payload(value)


@register.filter
def event_row(event) -> str:
    """An event's timeline row (assistant/rows.py: the live page pushes the same)."""
    return _event_row(event)


@register.filter
def failure(error) -> str:
    """An error in plain words, its technical text in a disclosure (escaped)."""
    found = failure_of(error)
    if not found.detail:
        return found.words
    return format_html('{} <details class="error-detail"><summary>Details</summary><code>{}</code></details>',
                       found.words, found.detail)


@register.filter
def failure_words(error) -> str:
    """An error in plain words alone (where no disclosure fits: an SVG title)."""
    return failure_of(error).words


@register.filter
def when(iso: str | None) -> str:
    """A time the export keeps as ISO text, as pages show times: in the viewer's zone,
    to the second."""
    if not iso:
        return ""
    return formats.date_format(timezone.localtime(datetime.fromisoformat(iso)), "j M Y, H:i:s")


@register.filter
def duration(ms) -> str:
    """"350 ms", "4.2 s", "2 min 05 s"; "" for what never ran (a cancelled agent)."""
    return duration_text(ms)


@register.filter
def words(state) -> str:
    """A turn's, agent's or skill call's state as pages say it: "paused: waiting for you"."""
    return state_words(state)


@register.filter
def cleared_by(clearance) -> str:
    """By whose word a side effect ran ("the owner's word: alice at …", "your rule: …");
    the outside content that had reached it is left to its own, marked line."""
    return clearance_words(clearance or {}, with_outside=False)


@register.filter
def question(pause) -> PauseWords:
    """A paused turn's question in plain words: what it reached, what is done, what
    Continue grants (orchestration/questions/pauses.py holds them)."""
    return pause_words_of(pause)


@register.filter
def rule_offer(approval) -> str:
    """The "always allow" rule an approval prompt offers, in words ("" when none is)."""
    return rule_offered(approval)


@register.simple_tag
def time_zone_options(selected: str) -> SafeString:
    """The time zone picker's options, `selected` marked (listed first when the picker
    does not offer it: a zone stored before, or the server's)."""
    return _time_zone_options(selected)


@lru_cache(maxsize=64)
def _time_zone_options(selected: str) -> SafeString:
    """Built once per zone a process shows (a few: its users' own), not at each visit of
    the conversation list: the template's loop over the picker's four hundred zones was
    most of that page's CPU."""
    parts = [] if is_picked_zone(selected) else [_option(selected, selected, selected)]
    for area, zones in time_zone_groups():
        options = format_html_join("", "{}", ((_option(name, place, selected),) for name, place in zones))
        parts.append(format_html('<optgroup label="{}">{}</optgroup>', area, options) if area else options)
    return format_html_join("", "{}", ((part,) for part in parts))


def _option(name: str, place: str, selected: str) -> SafeString:
    if name == selected:
        return format_html('<option value="{}" selected>{}</option>', name, place)
    return format_html('<option value="{}">{}</option>', name, place)
