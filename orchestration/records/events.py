"""The append-only event log, and its delivery to open pages.

An event is written in the caller's transaction and published to the conversation's
Channels group only after that transaction commits, once however many of the
conversation's events it wrote: a page never sees a fact that was rolled back. Delivery
is at most once; the page replays from the table to fill gaps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from orchestration.models import AgentDispatch, Conversation, Event, Turn

logger = logging.getLogger(__name__)


def group_name(conversation_id: int) -> str:
    return f"conversation-{conversation_id}"


def event_record(**fields) -> Event:
    """Save one event (`event_new`'s fields) in the caller's transaction."""
    event = event_new(**fields)
    event.save(force_insert=True)
    _publish_after_commit(event)
    return event


def event_new(
    *,
    type: str,
    summary: str,
    conversation: Conversation | None = None,
    turn: Turn | None = None,
    dispatch: AgentDispatch | None = None,
    payload: dict | None = None,
) -> Event:
    """An event not saved yet (`events_record` saves several at once)."""
    if turn is None and dispatch is not None:
        turn = dispatch.turn
    return Event(
        # by id: the conversation row is not needed, and reading it would cost a query
        conversation_id=conversation.pk if conversation is not None else turn.conversation_id,
        turn=turn, dispatch=dispatch, type=type, summary=summary[:300], payload=payload or {},
    )


def events_record(events: list[Event]) -> list[Event]:
    """Save `events` of one conversation in one INSERT, published once after the commit
    (a page reads every event it has not seen when told)."""
    if not events:
        return []
    Event.objects.bulk_create(events)
    _publish_after_commit(events[-1])
    return events


def _publish_after_commit(event: Event) -> None:
    """Publish once the transaction commits, once for all the conversation's events in
    it: a page reads every event it has not seen when told, so one message does."""
    connection = transaction.get_connection()
    if connection.in_atomic_block and any(
            getattr(func, "publishes", None) == event.conversation_id for _, func, _ in connection.run_on_commit):
        return

    def publish():
        event_publish(event)

    publish.publishes = event.conversation_id
    transaction.on_commit(publish)


PUBLISH_TIMEOUT_SECONDS = 5.0


def event_publish(event: Event) -> None:
    group_notify(event.conversation_id, {"type": "event.created", "event_id": event.pk})


def group_notify(conversation_id: int, message: dict) -> None:
    """Tell the conversation's open pages to read the database again (at most once: a
    page also reads on its own, so a lost message is repaired there)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if isinstance(layer, InMemoryChannelLayer):
            # Its queues belong to the consumers' loop in this process: send from there.
            async_to_sync(layer.group_send)(group_name(conversation_id), message)
        else:
            _publisher.run(layer.group_send(group_name(conversation_id), message))
    except Exception:
        logger.warning("Could not notify conversation %s of %s", conversation_id, message["type"], exc_info=True)


class _PublisherLoop:
    """One event loop per process, in a daemon thread, for every push to Redis.

    async_to_sync would start a thread and an event loop for each event, and
    channels_redis keeps a connection pool per loop: a new Redis connection per event,
    ~3 ms of a worker's CPU. On this loop the pool lives as long as the process (0.4 ms
    a push). A forked process starts its own loop.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def run(self, coroutine):
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())
        try:
            return future.result(timeout=PUBLISH_TIMEOUT_SECONDS)
        except TimeoutError:
            future.cancel()
            raise

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._loop = asyncio.new_event_loop()
                self._pid = os.getpid()
                threading.Thread(target=self._loop.run_forever, name="event-publisher", daemon=True).start()
            return self._loop


_publisher = _PublisherLoop()
