"""The append-only event log, and its delivery to open pages.

An event is written in the caller's transaction and published to the conversation's
Channels group only after that transaction commits, once however many of the
conversation's events it wrote: a page never sees a fact that was rolled back. Delivery
is at most once; the page replays from the table to fill gaps.

The message carries the events themselves (`event_carried`): a socket renders their rows
from it without reading the log, which was a third of daphne's CPU and much of
PostgreSQL's under load. The log stays the truth: a socket reads it when it connects,
when a message carries no rows (too big), and when its conversation's watch sees
something it was not told of (assistant/watch.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from django.utils.dateparse import parse_datetime

from orchestration.models import AgentDispatch, Conversation, Event, Turn
from orchestration.records.inserts import insert

logger = logging.getLogger(__name__)


def group_name(conversation_id: int) -> str:
    return f"conversation-{conversation_id}"


def event_record(**fields) -> Event:
    """Save one event (`event_new`'s fields) in the caller's transaction."""
    return events_record([event_new(**fields)])[0]


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
    """Save `events` in one INSERT, published once per conversation after the commit."""
    if not events:
        return []
    insert(events, EVENT_FIELDS)
    by_conversation: dict[int, list[Event]] = {}
    for event in events:
        by_conversation.setdefault(event.conversation_id, []).append(event)
    for batch in by_conversation.values():
        _publish_after_commit(batch)
    return events


EVENT_FIELDS = ("conversation", "turn", "dispatch", "type", "summary", "payload", "created_at")


def _publish_after_commit(events: list[Event]) -> None:
    """Publish once the transaction commits, in one message for all the conversation's
    events written at the same savepoint depth: a rolled-back savepoint drops its own
    message (Django drops the callbacks registered inside it), never another's rows."""
    conversation_id = events[0].conversation_id
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        depth = set(connection.savepoint_ids)
        for sids, func, _ in connection.run_on_commit:
            if getattr(func, "publishes", None) == conversation_id and sids == depth:
                func.events.extend(events)
                return

    def publish():
        events_publish(conversation_id, publish.events)

    publish.publishes = conversation_id
    publish.events = list(events)
    transaction.on_commit(publish)


# What a message carries at most; a bigger batch (a skill's long arguments in a payload)
# or answer draft is announced without it, and the sockets read it from the database.
MAX_CARRIED_CHARS = 32_000


def event_carried(event: Event) -> dict | None:
    """What a socket needs to render `event`'s row without the database, or None if that
    is not at hand (the row names its agent: the dispatch must be loaded already)."""
    if event.pk is None or event.created_at is None:
        return None
    agent_id = None
    if event.dispatch_id is not None:
        if not Event.dispatch.is_cached(event):
            return None
        agent_id = event.dispatch.agent_id
    return {"id": event.pk, "conversation_id": event.conversation_id, "turn_id": event.turn_id,
            "dispatch_id": event.dispatch_id, "agent_id": agent_id, "type": event.type,
            "summary": event.summary, "payload": event.payload, "created_at": event.created_at.isoformat()}


def event_from_carried(row: dict) -> Event:
    """The unsaved `Event` a socket renders from a message's row (`event_carried`)."""
    event = Event(id=row["id"], conversation_id=row["conversation_id"], turn_id=row["turn_id"],
                  dispatch_id=row["dispatch_id"], type=row["type"], summary=row["summary"],
                  payload=row["payload"], created_at=parse_datetime(row["created_at"]))
    if row["dispatch_id"] is not None:
        event.dispatch = AgentDispatch(pk=row["dispatch_id"], agent_id=row["agent_id"])
    return event


def _carried_rows(events: list[Event]) -> list[dict] | None:
    rows = [event_carried(event) for event in events]
    if None in rows or len(json.dumps(rows)) > MAX_CARRIED_CHARS:  # payloads are JSON: they were saved
        return None
    return rows


def events_publish(conversation_id: int, events: list[Event]) -> None:
    """Tell the conversation's open pages of `events`, with their rows when they fit."""
    message = {"type": "event.created", "event_id": events[-1].pk}
    if (rows := _carried_rows(events)) is not None:
        message["events"] = rows
    group_notify(conversation_id, message)


def group_notify(conversation_id: int, message: dict) -> None:
    """Tell the conversation's open pages what changed (at most once: a page also reads
    the database on its own, so a lost message is repaired there)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if isinstance(layer, InMemoryChannelLayer):
            # Its queues belong to the consumers' loop in this process: send from there.
            async_to_sync(layer.group_send)(group_name(conversation_id), message)
        else:
            _publisher.send(lambda: layer.group_send(group_name(conversation_id), message),
                            f"conversation {conversation_id}'s {message['type']}")
    except Exception:
        logger.warning("Could not notify conversation %s of %s", conversation_id, message["type"], exc_info=True)


# Publishes waiting for Redis (it is slow or down) beyond which more are dropped, not queued.
MAX_UNSENT = 10_000


class _PublisherLoop:
    """One event loop per process, in a daemon thread, for every push to Redis.

    async_to_sync would start a thread and an event loop for each event, and
    channels_redis keeps a connection pool per loop: a new Redis connection per event,
    ~3 ms of a worker's CPU. On this loop the pool lives as long as the process (0.4 ms
    a push). A forked process starts its own loop.

    The caller does not wait for the push: it runs in a commit's callbacks, and an agent
    whose step committed would otherwise wait for this thread to get the GIL and Redis
    to answer (5 ms at p50 under `make load`) before its next model call. The pushes
    leave one after another, in the order they were handed over; one that fails is
    logged, as before.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._sender: asyncio.Task | None = None
        self._pid = 0
        self.unsent = 0

    def send(self, make_coroutine: Callable[[], Coroutine], what: str) -> None:
        """Have `make_coroutine()` run on this process's publishing loop after those
        handed over before it, without waiting for it."""
        loop, queue = self._running()
        with self._lock:
            if self.unsent >= MAX_UNSENT:
                logger.warning("Dropped the notice of %s: %s earlier ones are not sent yet", what, self.unsent)
                return
            self.unsent += 1
        loop.call_soon_threadsafe(queue.put_nowait, (make_coroutine, what))

    async def _send_in_order(self, queue: asyncio.Queue) -> None:
        while True:
            make_coroutine, what = await queue.get()
            try:
                await make_coroutine()
            except Exception:
                logger.warning("Could not send the notice of %s", what, exc_info=True)
            finally:
                with self._lock:
                    self.unsent -= 1

    def _running(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop, queue = asyncio.new_event_loop(), asyncio.Queue()
                self._sender = loop.create_task(self._send_in_order(queue))  # runs once the loop does
                self._loop, self._queue, self._pid, self.unsent = loop, queue, os.getpid(), 0
                threading.Thread(target=loop.run_forever, name="event-publisher", daemon=True).start()
            return self._loop, self._queue


_publisher = _PublisherLoop()
