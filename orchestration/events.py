"""The append-only event log, and its delivery to open pages.

An event is written in the caller's transaction and published to the conversation's
Channels group only after that transaction commits: a page never sees a fact that was
rolled back. Delivery is at most once; the page replays from the table to fill gaps.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from orchestration.models import AgentDispatch, Conversation, Event, Turn

logger = logging.getLogger(__name__)


def group_name(conversation_id: int) -> str:
    return f"conversation-{conversation_id}"


def event_record(
    *,
    type: str,
    summary: str,
    conversation: Conversation | None = None,
    turn: Turn | None = None,
    dispatch: AgentDispatch | None = None,
    payload: dict | None = None,
) -> Event:
    if turn is None and dispatch is not None:
        turn = dispatch.turn
    if conversation is None:
        conversation = turn.conversation
    event = Event.objects.create(
        conversation=conversation,
        turn=turn,
        dispatch=dispatch,
        type=type,
        summary=summary[:300],
        payload=payload or {},
    )
    transaction.on_commit(lambda: event_publish(event))
    return event


def event_publish(event: Event) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            group_name(event.conversation_id), {"type": "event.created", "event_id": event.pk}
        )
    except Exception:  # the page replays from the table; a lost push is repaired there
        logger.warning("Could not publish event %s", event.pk, exc_info=True)
