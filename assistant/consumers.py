"""The live dashboard's socket: a dumb pipe from the event log to one page.

Authenticate and check ownership in `connect` (anyone else is closed with 4403 before
joining a group), refuse a socket over the per-user or per-conversation cap (4429), send
what the page has not seen, then push whenever told to. Two things bring a socket news:
a group message, which carries the new events' rows and the answer draft (with Redis, a
worker's event reaches daphne at once, and the socket renders it without reading the
database), and the conversation's one poller in this process (assistant/watch.py:
without Redis the only way a worker's events arrive; with it, a slow safety net), after
which the socket reads the log from its cursor. An idle socket costs nothing between
them.

Under load (`make load`: 50 sockets, ~25 events a second on 2 cores) two things keep a
socket cheap and the handshakes fast:

- One delivery task per socket pushes when told to. Being told only collects what the
  message carried (or flags a read), and a socket pushes at most once per
  ASSISTANT_PUSH_INTERVAL_SECONDS (the first event after a quiet spell at once): a burst
  of events costs one push and one render.
- The database work runs on small thread pools of its own (assistant/pooled.py): a
  connecting socket's reads on one, pushes on another, so a handshake does not queue
  behind the pushes of every open socket.
- The busy panels (counters, agent graph, waterfall: a few queries each, where an event's
  row is rendered once per process) go out on a lane of their own, one thread for the
  process, one render in flight per socket. The rows and the chat no longer wait behind
  them: under `make load` on a slow 2-core machine, an event's commit → socket went from
  0.5–0.95 s to 0.21–0.23 s at p50 (docs/performance-history.md, "The live page on a
  saturated daphne").
  The lane spends at most ASSISTANT_PANEL_CPU_SHARE of a core (assistant/pooled.py):
  with more busy pages than that serves, or daphne saturated, the lane is what slows
  down: each page's panels come less often, and what a socket owes meanwhile is joined
  into one render.

A tab in the background is sent nothing (the page says when it hides and shows): what
its messages carry is dropped, and the push when it shows reads the log from its cursor.

Close codes the page knows (static/js/live.js): 4403 not yours (or not signed in), 4429
too many live pages open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from assistant.live import (
    BUSY_PANELS,
    Cursor,
    panels_for,
    render_draft,
    render_events,
    render_panels,
    resume_floor,
    turn_moved,
    turn_running,
)
from assistant.pooled import busy_lane, handshake, pooled
from assistant.watch import TOO_MANY, poll_interval, socket_carried, socket_join, socket_leave, socket_shown
from orchestration.models import Conversation, Event
from orchestration.records.events import group_name
from orchestration.zones import user_time_zone

FORBIDDEN = 4403
logger = logging.getLogger(__name__)


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
        self.must_read = True  # the log, from the cursor: the first push is the catch-up
        self.inbox: list[dict] = []  # event rows carried by group messages, not pushed yet
        self.draft_in: str | None = None  # the newest answer draft a message carried
        self.busy_owed: frozenset[str] = frozenset()  # busy panels due, for `send_busy`
        self.busy_newest: Event | None = None  # the newest event of the push that owed them
        self.busy_sender: asyncio.Task | None = None
        self.hidden = False  # the page's tab is in the background: nothing is pushed until it shows
        refused = socket_join(user_id=self.conversation.owner_id, conversation_id=conversation_id, wake=self.wake)
        if refused:
            logger.info("Socket refused for conversation %s: %s", conversation_id, refused)
            await self.accept()
            await self.close(code=TOO_MANY, reason=refused[:120])
            return
        self.joined = True
        try:
            self.group = group_name(conversation_id)
            await self.channel_layer.group_add(self.group, self.channel_name)
            await self.accept()
            self.cursor = Cursor(await _resume_floor(conversation_id, last_id),
                                 turn_running=await _turn_running(conversation_id))
            await self.push()
        except BaseException:  # no disconnect follows a consumer that failed: count it out here
            self._leave()
            raise
        self.deliverer = asyncio.create_task(self.deliver())

    async def dispatch(self, message):
        """channels' own, without the `close_old_connections` it runs before every handler.
        That call is a hop to the process's one shared sync thread and back, for every
        message every socket receives, queued behind every other socket's hops (and the
        user lookups of sockets connecting: channels' AuthMiddleware runs there too).
        These handlers use no connection of that thread: their database work runs on
        assistant/pooled.py's pools, which close their own. Under `make load` an event
        then reached its page a third sooner, at p50 and p95 (docs/performance-history.md,
        "Off the shared thread")."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    def _leave(self) -> None:
        if getattr(self, "joined", False):
            self.joined = False
            socket_leave(user_id=self.conversation.owner_id, conversation_id=self.conversation.pk, wake=self.wake)

    async def disconnect(self, code):
        if getattr(self, "deliverer", None):
            self.deliverer.cancel()
        if getattr(self, "owed_timer", None) is not None:
            self.owed_timer.cancel()
        if getattr(self, "busy_sender", None) is not None:
            self.busy_sender.cancel()
        self._leave()
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        """The page says only whether its tab is in view (static/js/live.js). Nobody
        watches a hidden tab: it is sent nothing, and what its messages carried is
        dropped; when it shows again, one push reads the log from its cursor (as a
        reconnect's catch-up does) and the busy panels follow. Changes are htmx POSTs with
        CSRF, never socket messages; anything else a browser sends is ignored."""
        visible = _visibility(text_data)
        if visible is None or not getattr(self, "joined", False) or self.hidden != visible:
            return  # not a visibility, a socket refused, or no change
        self.hidden = not visible
        socket_shown(conversation_id=self.conversation.pk, wake=self.wake, visible=visible)
        if visible:
            # Whatever it missed, from the log: with no socket on the conversation in
            # view, its watch read nothing meanwhile (and without Redis nothing else told).
            self.must_read = True
            self.wanted.set()
            if self.busy_owed:
                self.owe_busy(frozenset(), newest=None)  # what it owes, as things are now

    def wake(self) -> None:
        """Something changed that no message told of (or that a hidden tab let go): read
        the log (and the draft), once the tab is in view."""
        self.must_read = True
        if not self.hidden:
            self.wanted.set()

    async def event_created(self, message):
        if "events" in message and not self.hidden:
            self.inbox.extend(message["events"])  # pushed by the delivery task with the rest
            socket_carried(conversation_id=self.conversation.pk, events=message["events"])
            self.wanted.set()
        else:  # too big to carry, or nobody looking: read from the log when it matters
            self.wake()

    async def answer_streamed(self, message):
        if "draft" in message and not self.hidden:
            self.draft_in = message["draft"]
            socket_carried(conversation_id=self.conversation.pk, draft=message["draft"])
            self.wanted.set()
        else:
            self.wake()

    async def deliver(self):
        """Push what messages brought, or read the log when the watch or a message asks,
        at most once per push interval.

        The flag is cleared before each push, so what arrives during one goes in the next;
        an event announced before a read of the log is in that read (it committed first)."""
        loop = asyncio.get_running_loop()
        pushed_at = float("-inf")
        while True:
            await self.wanted.wait()
            if self.hidden:  # a timer's wake-up: the tab's showing sets it again
                self.wanted.clear()
                continue
            if (wait := pushed_at + settings.ASSISTANT_PUSH_INTERVAL_SECONDS - loop.time()) > 0:
                await asyncio.sleep(wait)  # what else arrives meanwhile joins this read
            pushed_at = loop.time()
            self.wanted.clear()
            try:
                await self.push()
            except Exception:  # e.g. the database restarting: read again after a pause
                logger.warning("Could not push to conversation %s", self.conversation.pk, exc_info=True)
                await asyncio.sleep(poll_interval())
                self.wake()

    async def push(self):
        news = News(read=self.must_read, rows=self.inbox, draft=self.draft_in)
        self.must_read, self.inbox, self.draft_in = False, [], None
        push = await _render_new(self.conversation, self.cursor, news)
        if push.html:
            await self.send(text_data=push.html)
        if push.busy:
            self.owe_busy(push.busy, newest=push.newest)
        if self.cursor.owed_in is not None:  # busy panels held back: send them when due (one timer)
            if getattr(self, "owed_timer", None) is not None:
                self.owed_timer.cancel()
            self.owed_timer = asyncio.get_running_loop().call_later(self.cursor.owed_in, self.wanted.set)

    def owe_busy(self, panels: frozenset[str], *, newest: Event | None) -> None:
        """Send the busy panels due (`panels`, as of the push's `newest` event) on their
        own lane, after whatever this socket's lane holds already (one render in flight
        per socket, the rest joined)."""
        self.busy_owed |= panels
        self.busy_newest = newest
        if self.hidden:
            self.busy_newest = None  # sent when the tab shows: rendered afresh then
        elif self.busy_sender is None or self.busy_sender.done():
            self.busy_sender = asyncio.create_task(self.send_busy())

    async def send_busy(self):
        """Render and send what `owe_busy` collected until nothing is owed. Each render
        reads the state as it is then, and this is the only task that sends these panels:
        one never overwrites a newer one."""
        while self.busy_owed and not self.hidden:
            panels, self.busy_owed = self.busy_owed, frozenset()
            try:
                await self.send(text_data=await _render_busy(self.conversation, panels, self.busy_newest))
            except Exception:  # e.g. the database restarting: try again after a pause
                logger.warning("Could not send panels to conversation %s", self.conversation.pk, exc_info=True)
                self.busy_owed |= panels
                await asyncio.sleep(poll_interval())


def _visibility(text: str | None) -> bool | None:
    """`{"visible": true|false}` from the page, or None for anything else."""
    if not text or len(text) > 64:
        return None
    try:
        message = json.loads(text)
    except ValueError:
        return None
    visible = message.get("visible") if isinstance(message, dict) else None
    return visible if isinstance(visible, bool) else None


@busy_lane
def _render_busy(conversation: Conversation, panels: frozenset[str], newest: Event | None) -> str:
    with timezone.override(user_time_zone(conversation.owner)):
        return render_panels(conversation, panels, newest=newest)


@handshake
def _owned(user, conversation_id: int) -> Conversation | None:
    if user is None or not user.is_authenticated:
        return None
    return Conversation.objects.filter(pk=conversation_id, owner=user).first()


@handshake
def _resume_floor(conversation_id: int, last_id: int) -> int:
    return resume_floor(conversation_id, last_id)


@handshake
def _turn_running(conversation_id: int) -> bool:
    return turn_running(conversation_id)


@dataclass(frozen=True)
class News:
    """What a push has to send: the rows and draft messages carried, and whether to read
    the log (and the draft) from the cursor as well."""

    read: bool
    rows: list[dict]
    draft: str | None


class Push(NamedTuple):
    html: str  # the rows, chat panels and draft to send now
    busy: frozenset[str]  # the busy panels due, for `owe_busy`
    newest: Event | None  # the newest event pushed


@pooled
def _render_new(conversation: Conversation, cursor: Cursor, news: News) -> Push:
    """What to push, in the owner's time zone, as their pages are (no request here: no
    middleware). Read once per socket: the owner and their preferences stay cached on it."""
    with timezone.override(user_time_zone(conversation.owner)):
        events = cursor.received(news.rows)
        try:
            if news.read:
                events = sorted(events + cursor.new_events(conversation.pk), key=lambda event: event.pk)
            panels = cursor.panels_due(panels_for(events) if events else frozenset(), time.monotonic(),
                                       turn_moved=turn_moved(events))
            busy = panels & BUSY_PANELS.keys()
            html = render_events(conversation, events, panels - busy) + render_draft(
                conversation, cursor, text=news.draft, read=news.read)
            return Push(html=html, busy=busy, newest=events[-1] if events else None)
        except BaseException:
            cursor.forget(events)
            raise
