"""The live dashboard's socket: a dumb pipe from the event log to one page.

Authenticate and check ownership in `connect` (anyone else is closed with 4403 before
joining a group), send what the page has not seen, then push on every group message.
Without Redis the in-memory layer cannot hear other processes' workers, so the socket
also polls the event log; with Redis the poll is only a slow safety net.

Under load (`make load`: 50 sockets, ~25 events a second on 2 cores) two things keep a
socket cheap and the handshakes fast:

- One delivery task per socket reads the log when told to (a group message) or when
  nothing has read it for a poll interval. A group message only sets a flag, so a burst
  of events while a read is running costs one more read, not one per event.
- The database work runs on the event loop's thread pool, not on the one thread that
  channels shares among every consumer by default: that thread saturated, and new
  sockets' handshakes queued behind other sockets' pushes past daphne's 5 s handshake
  timeout (the browser's socket failed to open).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from urllib.parse import parse_qs

from channels.db import DatabaseSyncToAsync
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from assistant.live import Cursor, render_draft, render_events, resume_floor, turn_running
from assistant.preferences import user_time_zone
from orchestration.events import group_name
from orchestration.models import Conversation

FORBIDDEN = 4403
logger = logging.getLogger(__name__)


def poll_interval() -> float:
    in_memory = "InMemory" in settings.CHANNEL_LAYERS["default"]["BACKEND"]
    return 0.25 if in_memory else 5.0


class ConversationConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        conversation_id = int(self.scope["url_route"]["kwargs"]["conversation_id"])
        self.conversation = await _owned(self.scope.get("user"), conversation_id)
        if self.conversation is None:
            await self.accept()
            await self.close(code=FORBIDDEN)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            last_id = max(0, int(query.get("last", ["0"])[0]))
        except ValueError:
            last_id = 0
        self.wanted = asyncio.Event()
        self.group = group_name(conversation_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.cursor = Cursor(await _resume_floor(conversation_id, last_id),
                             turn_running=await _turn_running(conversation_id))
        await self.push()
        self.deliverer = asyncio.create_task(self.deliver())

    async def disconnect(self, code):
        if getattr(self, "deliverer", None):
            self.deliverer.cancel()
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        """Server → browser only: changes are htmx POSTs with CSRF, not socket messages."""

    async def event_created(self, message):
        self.wanted.set()  # the delivery task reads the log; events meanwhile join that read

    async def answer_streamed(self, message):
        self.wanted.set()  # the same read sends the answer so far

    async def deliver(self):
        """Read the log when a group message asks, or after a poll interval of quiet.

        The flag is cleared before each read, so an event announced during a read is
        read next time; one announced before it is in this read (it committed first)."""
        interval = poll_interval()
        while True:
            try:
                await asyncio.wait_for(self.wanted.wait(), timeout=interval)
            except TimeoutError:
                pass
            self.wanted.clear()
            try:
                await self.push()
            except Exception:  # e.g. the database restarting: the next read repairs the gap
                logger.warning("Could not push to conversation %s", self.conversation.pk, exc_info=True)
                await asyncio.sleep(interval)

    async def push(self):
        html = await _render_new(self.conversation, self.cursor)
        if html:
            await self.send(text_data=html)


def _pooled(func):
    """Database work on the loop's thread pool (`thread_sensitive=False`), not on the one
    thread every consumer shares. Each call is self-contained (no transaction spans two);
    a socket reads in one task, so in order. The call closes its connection itself (with
    CONN_MAX_AGE = 0): DatabaseSyncToAsync does too, but channels' test communicator
    stubs that out, and a pool thread would keep it open after the test."""

    @functools.wraps(func)
    def closing(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return DatabaseSyncToAsync(closing, thread_sensitive=False)


@_pooled
def _owned(user, conversation_id: int) -> Conversation | None:
    if user is None or not user.is_authenticated:
        return None
    return Conversation.objects.filter(pk=conversation_id, owner=user).first()


@_pooled
def _resume_floor(conversation_id: int, last_id: int) -> int:
    return resume_floor(conversation_id, last_id)


@_pooled
def _turn_running(conversation_id: int) -> bool:
    return turn_running(conversation_id)


@_pooled
def _render_new(conversation: Conversation, cursor: Cursor) -> str:
    """In the owner's time zone, as their pages are (no request here: no middleware).
    Read once per socket: the owner and their preferences stay cached on it."""
    with timezone.override(user_time_zone(conversation.owner)):
        return render_events(conversation, cursor.new_events(conversation.pk)) + render_draft(conversation, cursor)
