"""What the live page receives: HTML fragments for events it has not seen yet.

Every fragment is an htmx out-of-band swap with a stable id — rows are appended to
their turn's (or agent's) group, state panels (messages, composer, continue? prompt,
agent graph, counters) are replaced whole — so a repeated push does no harm (the page's
static/js/live.js drops appended rows it already has) and the next push after a dropped
one repairs the gap, because it sends everything after the last event sent.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Max
from django.template.loader import render_to_string
from django.utils import timezone

from orchestration import selectors
from orchestration.models import Conversation, Event

# Events can commit out of id order on PostgreSQL (ids are taken at insert, not commit):
# ids are only considered final once they are this old.
SETTLE_SECONDS = 5

PANEL_EVENT_PREFIXES = ("turn.", "limit.", "agent.", "orchestrator.", "skill.")


class Cursor:
    """Where one socket is in the conversation's event log."""

    def __init__(self, last_id: int):
        self.floor = last_id  # everything at or below has been sent (or rendered in the page)
        self.sent: set[int] = set()

    def new_events(self, conversation_id: int) -> list[Event]:
        events = [
            e for e in Event.objects.filter(conversation_id=conversation_id, id__gt=self.floor)
            .select_related("dispatch", "turn").order_by("id")
            if e.pk not in self.sent
        ]
        self.sent.update(e.pk for e in events)
        settled = timezone.now() - timedelta(seconds=SETTLE_SECONDS)
        older = [e.pk for e in Event.objects.filter(
            conversation_id=conversation_id, id__gt=self.floor, created_at__lt=settled).only("id")]
        if older and all(pk in self.sent for pk in older):
            self.floor = max(older)
            self.sent = {pk for pk in self.sent if pk > self.floor}
        return events


def replay_floor(conversation_id: int, shown_up_to: int) -> int:
    """Where a freshly rendered page's socket starts replaying.

    The page shows what had committed when it rendered, up to `shown_up_to`; on
    PostgreSQL an event with a smaller id can still commit after that. So the socket
    replays from the newest id that is settled instead, and the page drops the rows it
    already has (static/js/live.js).
    """
    settled = timezone.now() - timedelta(seconds=SETTLE_SECONDS)
    floor = Event.objects.filter(
        conversation_id=conversation_id, id__lte=shown_up_to, created_at__lt=settled
    ).aggregate(floor=Max("id"))["floor"]
    return floor or 0


def render_events(conversation: Conversation, events: list[Event]) -> str:
    """The fragments for `events`, followed by fresh state panels when anything changed."""
    if not events:
        return ""
    parts = [render_to_string("conversations/push.html", {"event": event}) for event in events]
    parts.append(render_to_string("conversations/panels.html", panel_context(conversation)))
    return "".join(parts)


def panel_context(conversation: Conversation) -> dict:
    turn = conversation.turns.order_by("-number").first()
    return {
        "conversation": conversation,
        "messages_": selectors.visible_messages(conversation=conversation),
        "active_turn": selectors.active_turn(conversation=conversation),
        "pause": selectors.open_pause(conversation=conversation),
        "answered_pauses": selectors.answered_pauses(conversation=conversation),
        "graph": selectors.agent_graph(turn=turn) if turn else [],
        "graph_turn": turn,
        "usage": selectors.conversation_usage(conversation=conversation),
        "oob": True,
    }
