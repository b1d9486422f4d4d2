"""The dashboard socket under load (issue 7, `make load`): a burst of events costs a few
reads of the log, not one per event, and the socket's database work does not queue on
the thread that channels shares among all consumers (where, at 50 sockets, handshakes
waited past daphne's 5 s timeout).

The rest of the socket's behaviour (auth, replay, order) is in tests/web/test_consumer.py.
"""

from __future__ import annotations

import asyncio
import re
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from assistant import live, watch
from assistant.consumers import FORBIDDEN
from orchestration.models import Conversation, Event, TurnPause
from orchestration.records.events import MAX_CARRIED_CHARS, event_record
from tests.factories import conversation_for, dispatch_for, turn_for
from tests.sockets import EVENT_ID, communicator, nothing_but_busy_panels

# How long a push may take to arrive: a group message wakes the socket at once, but on a
# loaded CI machine (three test processes and PostgreSQL on two cores) a push's reads and
# renders have taken over 3 s; what these tests hold is what arrives, not how soon.
PUSH_WAIT = 10

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def started(alice):
    conversation = conversation_for(alice)
    turn = turn_for(conversation)
    first = Event.objects.create(conversation=conversation, turn=turn, type="turn.started", summary="Turn 1 started")
    return conversation, turn, first


def counted_reads(monkeypatch) -> list[int]:
    """The socket's reads of the log, each as the number of events it found."""
    reads = []
    new_events = live.Cursor.new_events

    def counted(cursor, conversation_id):
        events = new_events(cursor, conversation_id)
        reads.append(len(events))
        return events

    async def asleep(self):  # no watch: the messages' pushes only
        await asyncio.Event().wait()

    monkeypatch.setattr(live.Cursor, "new_events", counted)
    monkeypatch.setattr(watch.Watch, "run", asleep)
    return reads


async def opened_counting(monkeypatch, conversation, user, first) -> tuple:
    """A socket, past its catch-up (`first` again: it has not settled, assistant/live.py
    resume_floor), and its reads of the log (the catch-up's is the first)."""
    reads = counted_reads(monkeypatch)
    comm = communicator(conversation.pk, user, last=first.pk)
    assert (await comm.connect())[0]
    await comm.receive_from()
    return comm, reads


async def received_ids(comm, expected: list[int]) -> list[int]:
    seen: list[int] = []
    while set(seen) != set(expected):
        seen += [int(i) for i in EVENT_ID.findall(await comm.receive_from(timeout=PUSH_WAIT))]
    return seen


async def test_a_burst_of_events_reaches_the_socket_without_reading_the_log(started, alice, monkeypatch):
    """The group message carries the events' rows: a busy turn's pushes read nothing
    (the reads were a third of daphne's CPU and much of PostgreSQL's under load)."""
    conversation, turn, first = started
    comm, reads = await opened_counting(monkeypatch, conversation, alice, first)
    assert reads == [1]  # the catch-up reads the log
    assert await nothing_but_busy_panels(comm, timeout=0.3)

    def burst() -> list[int]:
        with transaction.atomic():  # 20 events, announced in one message on commit
            return [event_record(type="orchestrator.llm_call", turn=turn, summary=f"call {i}").pk for i in range(20)]

    created = await database_sync_to_async(burst)()
    assert sorted(await received_ids(comm, created)) == created  # each exactly once
    assert await nothing_but_busy_panels(comm, timeout=1.0)
    assert reads == [1]  # the message brought them
    await comm.disconnect()


async def test_events_too_big_to_carry_are_read_from_the_log(started, alice, monkeypatch):
    conversation, turn, first = started
    comm, reads = await opened_counting(monkeypatch, conversation, alice, first)
    big = await database_sync_to_async(event_record)(
        type="skill.started", turn=turn, summary="a long email", payload={"body": "x" * (MAX_CARRIED_CHARS + 1)})
    assert await received_ids(comm, [big.pk]) == [big.pk]
    assert reads == [1, 1]
    await comm.disconnect()


async def test_an_event_rolled_back_with_its_savepoint_never_reaches_the_page(started, alice, monkeypatch):
    """One message per transaction carries the events of one savepoint depth: the rows of
    a savepoint that rolled back go with it, those of the rest of the transaction stay."""
    conversation, turn, first = started
    comm, _ = await opened_counting(monkeypatch, conversation, alice, first)

    def mixed() -> list[int]:
        with transaction.atomic():
            kept = [event_record(type="orchestrator.llm_call", turn=turn, summary="before").pk]
            try:
                with transaction.atomic():
                    event_record(type="skill.started", turn=turn, summary="undone")
                    raise RuntimeError
            except RuntimeError:
                pass
            kept.append(event_record(type="orchestrator.llm_call", turn=turn, summary="after").pk)
        return kept

    kept = await database_sync_to_async(mixed)()
    html = ""
    while not all(f'id="event-{pk}"' in html for pk in kept):
        html += await comm.receive_from(timeout=PUSH_WAIT)
    assert await nothing_but_busy_panels(comm)
    assert "undone" not in html and "after" in html  # (SQLite gives "after" the undone one's id)
    await comm.disconnect()


async def test_the_sockets_database_work_is_not_on_the_shared_sync_thread(started, alice, monkeypatch):
    """channels runs thread-sensitive calls of every consumer on one thread; the socket's
    reads (a few queries and a render each) go to the loop's pool instead."""
    conversation, _, first = started
    threads = []
    new_events = live.Cursor.new_events

    def recorded(cursor, conversation_id):
        threads.append(threading.current_thread())
        return new_events(cursor, conversation_id)

    monkeypatch.setattr(live.Cursor, "new_events", recorded)
    shared = await sync_to_async(threading.current_thread, thread_sensitive=True)()
    comm = communicator(conversation.pk, alice)
    assert (await comm.connect())[0]
    assert f'id="event-{first.pk}"' in await comm.receive_from(timeout=PUSH_WAIT)
    await comm.disconnect()
    assert threads and shared not in threads


async def test_a_socket_connects_while_every_push_thread_is_busy(started, alice, settings, monkeypatch):
    """A new page's socket reads what it must before it accepts on threads of its own:
    under load, queued behind every open socket's pushes, handshakes passed daphne's 5 s
    timeout. Here more sockets than any pool has threads hold their pushes."""
    conversation, _, first = started
    settings.ASSISTANT_SOCKETS_PER_CONVERSATION = settings.ASSISTANT_SOCKETS_PER_USER = 50
    held, pushes_free = threading.Event(), threading.Event()
    new_events = live.Cursor.new_events

    def slow(cursor, conversation_id):
        held.set()
        pushes_free.wait(timeout=20)
        return new_events(cursor, conversation_id)

    monkeypatch.setattr(live.Cursor, "new_events", slow)
    busy = [communicator(conversation.pk, alice) for _ in range(12)]
    try:
        for comm in busy:
            assert (await comm.connect(timeout=PUSH_WAIT))[0]  # accepted; its catch-up push is held
        assert held.is_set()
        late = communicator(conversation.pk, alice)
        assert (await late.connect(timeout=3))[0]
    finally:
        pushes_free.set()
    assert f'id="event-{first.pk}"' in await late.receive_from(timeout=PUSH_WAIT)
    for comm in busy + [late]:
        await comm.disconnect()


def test_a_push_re_renders_only_the_panels_its_events_can_change(started):
    """A skill call leaves the chat alone (markdown and sanitising a long chat again for
    every skill call was most of daphne's CPU); the turn's own events refresh it all."""
    conversation, turn, first = started
    ids = {"counters": 'id="counters"', "messages": 'id="messages"', "pause": 'id="pause-prompt"',
           "composer": 'id="composer"', "graph": 'id="agent-graph"'}

    def panels(*types: str) -> set[str]:
        events = [Event.objects.create(conversation=conversation, turn=turn, type=t, summary=t) for t in types]
        html = live.render_events(conversation, events)
        return {name for name, marker in ids.items() if marker in html}

    assert panels("skill.started", "skill.finished") == {"graph"}  # no spend: the counters stand
    assert panels("agent.subagent_started") == {"graph"}
    assert panels("orchestrator.llm_call") == {"counters"}
    assert panels("agent.llm_call") == {"counters", "graph"}
    assert panels("skill.finished", "turn.completed") == set(ids)
    assert panels("limit.tripped") == set(ids) - {"graph"}


def test_the_busy_panels_read_the_turns_agents_once(started, django_assert_num_queries):
    """The counters, the graph and the waterfall, rendered together on their lane: the
    latest turn, the agents, the spend (the turn's per agent and the conversation's, one
    grouped query) and the turn's events (the waterfall's bars and the graph's progress).
    Four statements, whatever the number of agents: it was seven (the turn's spend read
    twice, then the conversation's and the progress apart)."""
    conversation, turn, _ = started
    lead = dispatch_for(turn, "lead", state="running")
    for agent_id in ("a", "b", "c"):
        dispatch_for(turn, agent_id, parent=lead, state="running")
    with django_assert_num_queries(4):
        html = live.render_events(conversation, [], frozenset(live.BUSY_PANELS))
    assert all(f'data-agent="{agent_id}"' in html for agent_id in ("lead", "a", "b", "c"))  # the waterfall's rows
    assert html.count('class="node state-') == 4  # and the graph's nodes


def test_the_chat_panels_read_the_conversation_with_its_latest_turn(started, django_assert_num_queries):
    """A turn's start or end re-renders the chat's panels: the latest turn (with the
    conversation's title and outside content: a socket holds its conversation from
    before), the conversation's spend and the messages. The open pause is read only
    while the turn is paused, which it is exactly while one is open."""
    conversation, turn, _ = started
    chat = frozenset(live.PANELS) - live.BUSY_PANELS.keys() | {"counters"}
    Conversation.objects.filter(pk=conversation.pk).update(
        title="Renamed", outside=["a web page"], outside_since=timezone.now())
    with django_assert_num_queries(3):
        html = live.render_panels(conversation, chat)
    assert "Renamed" in html and "a web page" in html and 'id="pause-prompt"' in html
    assert "Continue" not in html

    turn.status = "paused"
    turn.save(update_fields=["status"])
    TurnPause.objects.create(turn=turn, limit="turn_max_llm_calls", detail={"used": 3})
    with django_assert_num_queries(4):
        html = live.render_panels(conversation, chat)
    assert "Continue" in html


def test_a_pushed_row_is_the_row_the_page_shows(alice_client, started):
    """One row whichever way it reaches the page: an agent's event, the orchestrator's,
    and one outside a turn, each with a payload and text a model wrote."""
    conversation, turn, first = started
    dispatch = dispatch_for(turn, agent_id="researcher")
    events = [first, Event.objects.create(conversation=conversation, turn=turn, dispatch=dispatch,
                                          type="skill.finished", summary="Read <b>notes</b>",
                                          payload={"skill": "file_read", "arguments": {"path": "a & b.txt"}}),
              Event.objects.create(conversation=conversation, type="conversation.renamed", summary="Renamed",
                                   payload={"title": "<i>new</i>"})]
    page = alice_client.get(reverse("conversation_detail", args=[conversation.pk])).content.decode()
    pushed = live.render_events(conversation, events, panels=frozenset())

    for event, who in zip(events, ("orchestrator", "researcher", "")):
        row = re.search(rf'<details class="event[^"]*" id="event-{event.pk}">.*?</details>', pushed, re.S).group()
        assert row in page and f'<span class="who">{who}</span>' in row
    assert "Read &lt;b&gt;notes&lt;/b&gt;" in pushed and "&lt;i&gt;new&lt;/i&gt;" in pushed


def test_two_sockets_on_one_conversation_share_one_render(started, monkeypatch):
    """A second tab (or a phone) on the conversation gets the same rows and panels without
    rendering them again: each event's row and each push's panels render once per process."""
    conversation, turn, first = started
    rendered = []
    real_template, real_row = live.render_to_string, live.event_row
    monkeypatch.setattr(live, "render_to_string",
                        lambda name, context: rendered.append(name) or real_template(name, context))
    monkeypatch.setattr(live, "event_row", lambda event: rendered.append("row") or real_row(event))
    events = [Event.objects.create(conversation=conversation, turn=turn, type=t, summary=t)
              for t in ("skill.started", "skill.finished")]

    tab, phone = live.render_events(conversation, events), live.render_events(conversation, events)

    assert tab == phone and 'id="agent-graph"' in tab
    assert rendered == ["row"] * 2 + ["conversations/panels.html"]
    newer = Event.objects.create(conversation=conversation, turn=turn, type="skill.started", summary="again")
    assert live.render_events(conversation, [newer]) != tab  # a newer event: its own row and panels
    assert rendered[3:] == ["row", "conversations/panels.html"]
    # The busy panels, on their own lane: once for both tabs as of the same newest event,
    # afresh when a socket sends what it owed (no event: a running bar grows with the clock).
    busy = frozenset(live.BUSY_PANELS)
    assert live.render_panels(conversation, busy, newest=newer) == live.render_panels(conversation, busy, newest=newer)
    live.render_panels(conversation, busy)
    assert rendered[5:] == ["conversations/panels.html"] * 2


# --- the streamed answer (issue 15) ---------------------------------------------------------

DRAFT = re.compile(r'<div id="answer-draft"[^>]*hx-swap-oob="true"[^>]*>(.*?)</div>\s*$', re.S)


def save_draft(turn, text: str) -> None:
    from orchestration.lifecycle.turns import turn_draft_save

    turn.lease_token = "worker"
    turn.save(update_fields=["lease_token"])
    turn_draft_save(turn=turn, token="worker", text=text)


async def next_draft(comm) -> str:
    while True:
        html = await comm.receive_from(timeout=PUSH_WAIT)
        if 'id="answer-draft"' in html:
            return html


async def test_the_socket_pushes_the_answer_as_it_streams_and_stops_when_the_turn_ends(started, alice):
    conversation, turn, first = started
    await database_sync_to_async(save_draft)(turn, "Bob has")
    comm = communicator(conversation.pk, alice, last=first.pk)
    assert (await comm.connect())[0]
    assert "Bob has" in await next_draft(comm)  # what arrived before the socket opened

    await database_sync_to_async(save_draft)(turn, "Bob has the **list**")
    html = await next_draft(comm)
    assert "Bob has the <strong>list</strong>" in html and 'class="message assistant streaming"' in html
    assert await nothing_but_busy_panels(comm)  # unchanged: not sent again (the catch-up's panels may follow)

    def complete():
        from orchestration.lifecycle.turns import turn_complete
        from orchestration.records.history import message_append

        answer = message_append(turn=turn, role="assistant", content="Bob has the list.")
        turn_complete(turn_id=turn.pk, token="worker", answer=answer)

    await database_sync_to_async(complete)()
    html = await comm.receive_from(timeout=PUSH_WAIT)
    assert "Bob has the list." in html and 'id="answer-draft"' not in html  # the message replaced it
    assert await nothing_but_busy_panels(comm, timeout=0.6)  # polls read no draft once the turn is over
    await comm.disconnect()


async def test_the_draft_arrives_in_its_message_unless_too_long(started, alice, monkeypatch):
    conversation, turn, first = started
    comm, reads = await opened_counting(monkeypatch, conversation, alice, first)
    await database_sync_to_async(save_draft)(turn, "Bob has")
    assert "Bob has" in await next_draft(comm)
    assert reads == [1]  # the message carried the draft

    long = "word " * (MAX_CARRIED_CHARS // 5) + "the end"
    await database_sync_to_async(save_draft)(turn, long)
    assert "the end" in await next_draft(comm)
    assert reads == [1, 0]  # announced without it: the socket read the log and the draft
    await comm.disconnect()


async def test_a_streamed_draft_is_sanitised_like_the_answer(started, alice):
    conversation, turn, first = started
    await database_sync_to_async(save_draft)(
        turn, 'Done <script>alert(1)</script> [x](javascript:alert(2)) <img src=x onerror=alert(3)>')
    comm = communicator(conversation.pk, alice, last=first.pk)
    assert (await comm.connect())[0]
    html = await next_draft(comm)
    assert "Done" in html
    assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
    assert not re.search(r"<[^>]*onerror", html)  # what survives is text, escaped
    await comm.disconnect()


async def test_another_users_socket_gets_no_draft(started, bob):
    conversation, turn, _ = started
    await database_sync_to_async(save_draft)(turn, "secret plans")
    comm = communicator(conversation.pk, bob)
    await comm.connect()
    assert await comm.receive_output(timeout=3) == {"type": "websocket.close", "code": FORBIDDEN}
    # As a browser does: left running, the consumer's task would be cancelled at the event
    # loop's close, inside its channel layer's receive, which once hung the run (Redis).
    await comm.disconnect()


def test_a_draft_of_a_stopped_or_taken_over_turn_is_not_written(started):
    from orchestration.lifecycle.turns import turn_draft_save

    conversation, turn, _ = started
    turn_draft_save(turn=turn, token="not-the-lease", text="stale")
    turn.refresh_from_db()
    assert turn.answer_draft == ""
