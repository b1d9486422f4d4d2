"""An event's row in the timeline, built in Python rather than by the template engine.

The live page sends every event's row to each conversation's sockets, and under `make
load` rendering those rows through a template was a sixth of daphne's CPU (a py-spy
profile): the engine's context, include and filter machinery cost many times the few
strings a row is made of. The page's own timeline uses the same function (the
`event_row` filter), so a row looks the same whichever way it reached the page.
"""

from __future__ import annotations

from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.text import slugify

from assistant.payloads import html_format, render_payload
from orchestration.models import Event

ROW = (
    '<details class="event type-{}" id="event-{}">\n'
    '  <summary><time datetime="{}">{}</time>\n'
    '    <span class="who">{}</span>\n'
    "    {}</summary>\n"
    '  <div class="muted">{}</div>\n'
    "  {}\n"
    "</details>"
)


def event_row(event: Event) -> SafeString:
    """The row, every value escaped (summaries and payloads carry model output), its time
    in the active time zone as pages show times."""
    created = event.created_at
    return html_format(
        ROW, slugify(event.type), event.pk, created.isoformat(),
        timezone.localtime(created).strftime("%H:%M:%S"), _who(event), event.summary, event.type,
        render_payload(event.payload),
    )


def _who(event: Event) -> str:
    """The agent the event belongs to, the orchestrator for the rest of a turn's."""
    if event.dispatch_id:
        return event.dispatch.agent_id
    return "orchestrator" if event.turn_id else ""
