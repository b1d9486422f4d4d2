"""What the live page receives: HTML fragments for events it has not seen yet.

Every fragment is an htmx out-of-band swap with a stable id — rows are appended to the
one timeline list (the page puts a row that committed late in its place by event id),
state panels (messages, composer, continue? prompt, agent graph, counters) are replaced
whole — so a repeated push does no harm (the page's static/js/live.js drops appended rows
it already has) and the next push after a dropped one repairs the gap, because it sends
everything after the last event sent. The page's own posts get no panels back: these
pushes are their one source (assistant/views.py `_after_change`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max
from django.template.loader import render_to_string
from django.utils import timezone

from assistant.rows import event_row
from orchestration.llm.offline import EXAMPLE_REQUESTS
from orchestration.models import ACTIVE_TURN_STATUSES, Conversation, Event, Turn, TurnStatus
from orchestration.records.catalogue import AGENT_LLM_CALL, ORCHESTRATOR_LLM_CALL, TURN_RESTS, TURN_RUNS
from orchestration.records.compiled import CompiledRead, instance
from orchestration.records.events import event_from_carried
from orchestration.reports import selectors
from orchestration.reports.waterfall import turn_waterfall

# Events can commit out of id order on PostgreSQL (ids are taken at insert, not commit):
# ids are only considered final once they are this old.
SETTLE_SECONDS = 5

NEWEST = 2**63 - 1  # an id above every event's: `replay_floor` up to it is the newest settled one


def _unseen_read(*fields: str) -> CompiledRead:
    return CompiledRead(lambda conversation_id, floor: Event.objects.filter(
        conversation_id=conversation_id, id__gt=floor).order_by("id").values_list("id", "created_at", *fields), arity=2)


# Every push that reads the log, and every probe, runs one of these: compiled once.
_unseen, _unseen_types = _unseen_read(), _unseen_read("type")


class _Seen:
    """The ids of a conversation's events already read: a floor (everything at or below
    it) and the ids above it. Ids only settle after SETTLE_SECONDS (an event with a
    smaller id can still commit), so the floor only rises past settled ones."""

    def __init__(self, floor: int):
        self.floor = floor
        self.sent: set[int] = set()

    def unseen(self, conversation_id: int, *, types: bool = False) -> list[tuple]:
        """(id,) or with `types` (id, type) of the events not read yet, one light query
        that also moves the floor."""
        settled = timezone.now() - timedelta(seconds=SETTLE_SECONDS)
        rows = (_unseen_types if types else _unseen)(conversation_id, self.floor)
        new = [(row[0], *row[2:]) for row in rows if row[0] not in self.sent]
        self.sent.update(row[0] for row in new)
        older = [row[0] for row in rows if row[1] < settled]
        if older:  # all read by now: everything at or below the newest settled id is done
            self.floor = max(older)
            self.sent = {pk for pk in self.sent if pk > self.floor}
        return new


class Cursor(_Seen):
    """Where one socket is in the conversation's event log, and in the streamed answer."""

    def __init__(self, floor: int, *, turn_running: bool = False):
        super().__init__(floor)  # everything at or below has been sent (or is in the page)
        # While a turn runs the socket also reads its answer draft; the draft it sent last
        # (None: the page's, unknown — sent again once, which does no harm).
        self.turn_running = turn_running
        self.draft: str | None = None
        self.rendered_at: dict[str, float] = {}  # busy panel → when this socket last sent it
        self.owed: frozenset[str] = frozenset()  # busy panels held back, for the next push
        self.owed_in: float | None = None  # seconds until they are due

    def panels_due(self, panels: frozenset[str], now: float, *, turn_moved: bool = False) -> frozenset[str]:
        """Of `panels` (and those owed), the ones to render now: a busy panel at most
        once per its interval, unless the turn started, resumed or came to rest
        (`turn_moved`: the page shows where it stands at once); the rest are owed
        (`owed_in`)."""
        interval = 0.0 if turn_moved else settings.ASSISTANT_PANEL_INTERVAL_SECONDS
        wanted = panels | self.owed
        late = frozenset(p for p in wanted & BUSY_PANELS.keys()
                         if now - self.rendered_at.get(p, float("-inf")) < interval * BUSY_PANELS[p])
        for panel in (wanted - late) & BUSY_PANELS.keys():
            self.rendered_at[panel] = now
        self.owed = late
        self.owed_in = min(interval * BUSY_PANELS[p] - (now - self.rendered_at[p]) for p in late) if late else None
        return wanted - late

    def new_events(self, conversation_id: int) -> list[Event]:
        """The events not sent yet, in id order. Ids and times first (a light query that
        also moves the floor), whole rows only for what is new: during a busy turn every
        read would otherwise load again each event of the last SETTLE_SECONDS."""
        new_ids = [pk for (pk,) in self.unseen(conversation_id)]
        try:
            events = list(Event.objects.for_timeline().filter(pk__in=new_ids).order_by("id")) if new_ids else []
        except BaseException:
            self.sent.difference_update(new_ids)
            raise
        return self._follow(events)

    def received(self, rows: list[dict]) -> list[Event]:
        """The events of group messages' rows (`event_carried`) not sent yet, in id order:
        no database. The floor moves at the next read of the log (`new_events`)."""
        events = sorted((event_from_carried(row) for row in rows
                         if row["id"] > self.floor and row["id"] not in self.sent), key=lambda event: event.pk)
        self.sent.update(event.pk for event in events)
        return self._follow(events)

    def forget(self, events: list[Event]) -> None:
        """`events` did not reach the page (the push failed): the next read sends them."""
        self.sent.difference_update(event.pk for event in events)

    def _follow(self, events: list[Event]) -> list[Event]:
        for event in events:
            if event.type in TURN_RUNS or event.type in TURN_RESTS:
                self.turn_running = event.type in TURN_RUNS
        return events


class Probe(_Seen):
    """What a conversation's one poller (assistant/watch.py) reads: enough to tell that
    something changed since its last read (an event, or the running turn's answer
    draft), never what. Each socket then reads what it has not sent from its own cursor.
    With Redis, what the group messages carried to the sockets is news to nobody: the
    watch hands it over before each read (`carried`), and a busy turn's events wake no
    socket to read the log again.

    The first read reports a change whatever it finds: a socket that joined the watch
    read its catch-up before the probe's first read, and an event committed in between
    is already below what that read calls new."""

    def __init__(self, conversation_id: int):
        super().__init__(floor=0)
        self.conversation_id = conversation_id
        self.first = True
        self.turn_running: bool | None = None
        self.draft: str | None = None

    def carried(self, types: dict[int, str], draft: str | None) -> None:
        """What group messages brought this process's sockets since the last read (event
        id → type, the newest draft): already pushed, so no news for the safety net."""
        for pk in sorted(types):
            if pk > self.floor and pk not in self.sent:
                self.sent.add(pk)
                self._follow_type(types[pk])
        if draft is not None:
            self.draft = draft

    def _follow_type(self, type_: str) -> None:
        if type_ in TURN_RUNS or type_ in TURN_RESTS:
            self.turn_running = type_ in TURN_RUNS

    def changed(self) -> bool:
        if self.first:
            self.floor = replay_floor(self.conversation_id, NEWEST)
            self.sent = set()
        new = self.unseen(self.conversation_id, types=True)
        for _, type_ in new:
            self._follow_type(type_)
        if self.turn_running is None:
            self.turn_running = turn_running(self.conversation_id)
        draft_changed = False
        if self.turn_running:
            draft = running_draft(self.conversation_id)
            draft_changed, self.draft = draft != self.draft, draft
        first, self.first = self.first, False
        return first or bool(new) or draft_changed


_running_draft = CompiledRead(lambda conversation_id: Turn.objects.filter(
    conversation_id=conversation_id, status=TurnStatus.RUNNING).values_list("answer_draft")[:1])


def running_draft(conversation_id: int) -> str | None:
    """The running turn's answer so far ("" before it streams), or None when no turn runs."""
    rows = _running_draft(conversation_id)
    return rows[0][0] if rows else None


def turn_running(conversation_id: int) -> bool:
    return Turn.objects.filter(conversation_id=conversation_id, status__in=ACTIVE_TURN_STATUSES).exists()


def render_draft(conversation: Conversation, cursor: Cursor, *, text: str | None = None, read: bool = True) -> str:
    """The running turn's answer so far, if it changed since the socket last sent it:
    `text` as a group message carried it, or else, with `read`, as stored.

    Only while a turn runs (the read is one light query); rendered through the same
    markdown and sanitiser as the stored answer, into the placeholder the messages panel
    keeps for it while the turn runs."""
    if not cursor.turn_running:
        return ""
    if text is None and read:
        text = running_draft(conversation.pk)
        if text is None:
            # No turn runs now (it ended, paused or waits on agents since this socket read
            # its events): the panels just rendered may hold no placeholder, and a draft
            # pushed at none is an htmx:oobErrorNoTarget. The panels show the turn's state.
            return ""
    if text is None or text == cursor.draft:
        return ""
    cursor.draft = text
    return render_to_string("conversations/draft.html", {"draft": text, "draft_oob": True})


def replay_floor(conversation_id: int, shown_up_to: int, *, read_at: datetime | None = None) -> int:
    """Where the socket of a page that shows events up to `shown_up_to`, read at
    `read_at` (by default now: a page being rendered), starts replaying.

    On PostgreSQL an event with a smaller id can still commit after that read. So the
    socket replays from the newest id that was settled when the page read its events:
    everything at or below it had committed by then, so the page has it. The page drops
    the rows it already has (static/js/live.js).
    """
    settled = (read_at or timezone.now()) - timedelta(seconds=SETTLE_SECONDS)
    floor = Event.objects.filter(
        conversation_id=conversation_id, id__lte=shown_up_to, created_at__lt=settled
    ).aggregate(floor=Max("id"))["floor"]
    return floor or 0


def resume_floor(conversation_id: int, last: int) -> int:
    """Where a connecting socket starts replaying, for a page that says it holds events
    up to `last` (static/js/live.js sends its largest event id on every connect).

    `last` is a hint, not a floor: the page may have read it while an event with a
    smaller id was still uncommitted, and lost its socket before that event arrived.
    Nor is the newest id settled *now* enough: after a restart of daphne `last` has long
    settled itself, and that late event would be skipped for good. What counts is when
    the page read `last`, and it cannot have been before `last` was created: so this is
    `replay_floor` as of that moment. The socket resends the events of the SETTLE_SECONDS
    before `last`, and the page drops those it has.
    """
    held_at = (Event.objects.filter(conversation_id=conversation_id, id__lte=last)
               .order_by("-id").values_list("created_at", flat=True).first())
    return replay_floor(conversation_id, last, read_at=held_at) if held_at else 0


# The panels a push re-renders: only those its events can have changed. The chat, the
# continue? prompt, the composer and the outside content the conversation carries (it
# grows when a turn ends) change with the turn's own events (a message sent, answered,
# paused, resumed, stopped); the agent graph with the agents' and skills' events too;
# the counters (tokens, cost, the turn's state) with the turn's events and the model calls
# (the only ones that add spend). A long chat is then not run through markdown and the
# sanitiser again for every skill call (that was most of daphne's CPU under load).
PANELS = ("counters", "outside", "messages", "pause", "composer", "graph", "waterfall")
# The panels that change with nearly every event of a running turn (the counters with each
# model call, the graph and the waterfall with each step): a socket sends each at most once
# per its interval (the waterfall, the dearest, every third), and what it held back with
# its next push, which the consumer schedules. A person reads them at that pace; rendering
# them for every step was most of daphne's CPU under load. The chat's panels follow their
# events at once.
BUSY_PANELS = {"counters": 1, "graph": 1, "waterfall": 3}  # → intervals, in ASSISTANT_PANEL_INTERVAL_SECONDS
CHAT_EVENT_PREFIXES = ("turn.", "limit.")
GRAPH_EVENT_PREFIXES = ("turn.", "agent.", "skill.")
SPEND_EVENTS = (ORCHESTRATOR_LLM_CALL, AGENT_LLM_CALL)


def turn_moved(events: list[Event]) -> bool:
    return any(event.type in TURN_RUNS or event.type in TURN_RESTS for event in events)


def panels_for(events: list[Event]) -> frozenset[str]:
    types = [event.type for event in events]
    panels = set()
    if any(t in SPEND_EVENTS for t in types):
        panels.add("counters")
    if any(t.startswith(CHAT_EVENT_PREFIXES) for t in types):
        panels |= {"counters", "outside", "messages", "pause", "composer"}
    if any(t.startswith(GRAPH_EVENT_PREFIXES) for t in types):
        panels |= {"graph", "waterfall"}
    elif any(t.startswith("orchestrator.") for t in types):
        panels.add("waterfall")  # its model-call bars
    return frozenset(panels)


class _Rendered:
    """HTML this process rendered already, shared by every socket it serves: an event's
    row never changes, and the panels a push of a conversation's newest event re-renders
    are the same for each socket open on it (a second tab, a phone) — they belong to the
    conversation, not to the socket. Bounded; the oldest entries go first."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, render: Callable[[], str]) -> str:
        with self._lock:
            html = self._items.get(key)
        if html is None:
            html = render()
            with self._lock:
                self._items[key] = html
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return html


_rendered = _Rendered(size=4096)


def render_events(conversation: Conversation, events: list[Event], panels: frozenset[str] | None = None) -> str:
    """The fragments for `events`, followed by the state panels they can have changed
    (or `panels`: a socket's choice, `Cursor.panels_due`)."""
    panels = panels_for(events) if panels is None else panels
    if not events and not panels:
        return ""
    # Keyed by id and time: an id alone can come back after a rollback (tests, SQLite);
    # and by the active time zone, which the times in the HTML are shown in.
    zone = timezone.get_current_timezone_name()
    parts = [_rendered.get(("event", event.pk, event.created_at, zone), lambda event=event: _pushed_row(event))
             for event in events]
    if panels:
        parts.append(render_panels(conversation, panels, newest=events[-1] if events else None))
    return "".join(parts)


def _pushed_row(event: Event) -> str:
    """The event's row, appended to the timeline (static/js/live.js moves a late one to
    its place by id)."""
    return f'<div hx-swap-oob="beforeend:#timeline">{event_row(event)}</div>'


def render_panels(conversation: Conversation, panels: frozenset[str], *, newest: Event | None = None) -> str:
    """The state panels `panels` as of `newest`, the newest event of the push that made
    them due: rendered once per process for every socket that sends them for it (see
    `_Rendered`). Without one (panels a socket owed), rendered afresh: a running agent's
    bar in the waterfall grows with the clock."""
    def render() -> str:
        return render_to_string("conversations/panels.html", panel_context(conversation, panels))

    if newest is None:
        return render()
    key = ("panels", conversation.pk, newest.pk, newest.created_at, panels, timezone.get_current_timezone_name())
    return _rendered.get(key, render)


# What the panels read of the conversation's latest turn (the waterfall the most), and of
# the conversation what a turn changes: its title (set by the first message) and the
# outside content it carries (grown when a turn ends). A socket holds its conversation
# from before. Compiled once (orchestration/records/compiled.py): every render reads it.
LATEST_TURN_FIELDS = ("id", "conversation_id", "number", "status", "answer_draft", "started_at", "finished_at",
                      "error")
LATEST_CONVERSATION_FIELDS = ("conversation__title", "conversation__outside", "conversation__outside_since")
_latest_turn = CompiledRead(lambda conversation_id: Turn.objects.filter(conversation_id=conversation_id)
                            .order_by("-number").values_list(*LATEST_TURN_FIELDS, *LATEST_CONVERSATION_FIELDS)[:1])


def latest_turn(conversation: Conversation) -> Turn | None:
    """The conversation's latest turn (only `LATEST_TURN_FIELDS` read), with what a turn
    changes of `conversation` brought up to date on it."""
    rows = _latest_turn(conversation.pk)
    if not rows:
        return None
    turn_values, (title, outside, outside_since) = rows[0][:len(LATEST_TURN_FIELDS)], rows[0][len(LATEST_TURN_FIELDS):]
    conversation.title, conversation.outside, conversation.outside_since = title, outside, outside_since
    latest = instance(Turn, LATEST_TURN_FIELDS, turn_values)
    latest.conversation = conversation
    return latest


def panel_context(conversation: Conversation, panels: frozenset[str] = frozenset(PANELS)) -> dict:
    """What the state panels show; with `panels`, only what those panels need."""
    context = {"conversation": conversation, "panels": panels, "oob": True}
    # One turn at a time is active, and it is the latest: one query serves every panel.
    latest = latest_turn(conversation)
    context["active_turn"] = latest if latest is not None and latest.status in ACTIVE_TURN_STATUSES else None
    # The graph and the waterfall show the same agents and spend, the counters the
    # conversation's spend (with the agents', one query), the graph and the waterfall the
    # same events: each read once for all.
    agents = (selectors.turn_agents(latest, conversation_usage="counters" in panels)
              if latest and panels & {"graph", "waterfall"} else None)
    events = selectors.turn_events(latest) if latest and "waterfall" in panels else None
    if "counters" in panels:
        context["usage"] = agents.conversation if agents else selectors.conversation_usage(conversation=conversation)
    if "messages" in panels:
        context["messages_"] = selectors.visible_messages(conversation=conversation)
        context["suggestions"] = EXAMPLE_REQUESTS[:4]  # shown while the chat is empty
    if panels & {"pause", "composer"}:
        context["pause"] = selectors.open_pause(turn=latest)
    if "graph" in panels:
        graph, graph_spend = selectors.agent_graph(turn=latest, agents=agents, events=events) if latest else ([], None)
        context.update(graph=graph, graph_spend=graph_spend, graph_turn=latest)
    if "waterfall" in panels:
        context["waterfall"] = turn_waterfall(latest, agents=agents, events=events) if latest else None
    return context
