"""The live dashboard's socket: a dumb pipe from the event log to one page.

Authenticate and check ownership in `connect` (anyone else is closed with 4403 before
joining a group), send what the page has not seen, then push on every group message.
Without Redis the in-memory layer cannot hear other processes' workers, so the socket
also polls the event log; with Redis the poll is only a slow safety net.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from assistant.live import Cursor, render_events
from orchestration.events import group_name
from orchestration.models import Conversation

FORBIDDEN = 4403


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
        self.cursor = Cursor(last_id)
        self.lock = asyncio.Lock()
        self.group = group_name(conversation_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.push()
        self.poller = asyncio.create_task(self.poll())

    async def disconnect(self, code):
        if getattr(self, "poller", None):
            self.poller.cancel()
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        """Server → browser only: changes are htmx POSTs with CSRF, not socket messages."""

    async def event_created(self, message):
        await self.push()

    async def poll(self):
        interval = poll_interval()
        while True:
            await asyncio.sleep(interval)
            await self.push()

    async def push(self):
        async with self.lock:
            html = await _render_new(self.conversation, self.cursor)
            if html:
                await self.send(text_data=html)


@database_sync_to_async
def _owned(user, conversation_id: int) -> Conversation | None:
    if user is None or not user.is_authenticated:
        return None
    return Conversation.objects.filter(pk=conversation_id, owner=user).first()


@database_sync_to_async
def _render_new(conversation: Conversation, cursor: Cursor) -> str:
    return render_events(conversation, cursor.new_events(conversation.pk))
