"""The dashboard socket: auth, ownership, replay after the last id, order, live pushes.

Every test disconnects its communicators: a consumer still waiting on the channel layer
when the test's event loop closes is cancelled there, and channels_redis's receive once
held that cancellation (and the whole run) for pytest-timeout's 300 s."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.test import Client

from assistant import live
from orchestration.models import Event
from orchestration.records.events import event_record
from tests.factories import conversation_for, turn_for
from tests.sockets import communicator, next_rows, nothing_but_busy_panels, only_busy_panels

pytestmark = pytest.mark.django_db(transaction=True)





class LateCommit:
    """An event inserted (taking its id) on another connection, committed only when the
    `with` block ends: on PostgreSQL, events created inside the block get bigger ids yet
    commit first. `late["event"]` is the late one."""

    def __init__(self, conversation, turn):
        self.conversation, self.turn = conversation, turn
        self.inserted, self.release, self.late = threading.Event(), threading.Event(), {}
        self.writer = threading.Thread(target=self._write)

    def _write(self):
        try:
            with transaction.atomic():
                self.late["event"] = Event.objects.create(
                    conversation=self.conversation, turn=self.turn, type="orchestrator.llm_call", summary="late")
                self.inserted.set()
                self.release.wait(10)
        finally:
            connection.close()

    def __enter__(self) -> dict:
        self.writer.start()
        assert self.inserted.wait(10)
        return self.late

    def __exit__(self, *exc_info):
        self.release.set()
        self.writer.join()


@pytest.fixture
def trail(alice):
    conversation = conversation_for(alice)
    turn = turn_for(conversation)
    events = [
        Event.objects.create(conversation=conversation, turn=turn, type="turn.started", summary="Turn 1 started"),
        Event.objects.create(conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="call one"),
        Event.objects.create(conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="call two"),
    ]
    return conversation, turn, events


async def test_anonymous_socket_is_closed_4403(trail):
    from django.contrib.auth.models import AnonymousUser

    conversation, _, _ = trail
    comm = communicator(conversation.pk, AnonymousUser())
    connected, _ = await comm.connect()
    assert connected
    assert await comm.receive_output() == {"type": "websocket.close", "code": 4403}
    await comm.disconnect()


async def test_other_users_socket_is_closed_4403(trail, bob):
    conversation, _, _ = trail
    comm = communicator(conversation.pk, bob)
    await comm.connect()
    assert (await comm.receive_output())["code"] == 4403
    await comm.disconnect()


@pytest.mark.parametrize("conversation_id", [10**6, 2**63], ids=["missing", "beyond-bigint"])
async def test_a_conversation_that_does_not_exist_is_closed_4403(trail, alice, conversation_id):
    """The same close as for someone else's conversation: the socket tells no id apart."""
    comm = communicator(conversation_id, alice)
    await comm.connect()
    assert await comm.receive_output() == {"type": "websocket.close", "code": 4403}
    await comm.disconnect()


async def test_staff_cannot_follow_someone_elses_conversation_live(trail, staff):
    """Staff read audit trails (a page), not the owner's live chat."""
    conversation, _, _ = trail
    comm = communicator(conversation.pk, staff)
    await comm.connect()
    assert (await comm.receive_output())["code"] == 4403
    await comm.disconnect()


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def through_the_site(conversation_id: int, *, user=None, origin: bytes = b"http://testserver"):
    """A socket opened through assistant.asgi's whole stack (origin check, session auth),
    with `user`'s session cookie as the browser would send it."""
    from assistant.asgi import application as site

    headers = [(b"host", b"testserver"), (b"origin", origin)]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
    comm = WebsocketCommunicator(site, f"/ws/conversations/{conversation_id}/", headers=headers)
    return comm, await comm.connect()


async def test_the_real_stack_closes_an_outsiders_session_4403(trail, bob, alice):
    conversation, _, events = trail
    comm, (connected, _) = await through_the_site(conversation.pk, user=bob)
    assert connected and await comm.receive_output() == {"type": "websocket.close", "code": 4403}
    await comm.disconnect()
    comm, (connected, _) = await through_the_site(conversation.pk)
    assert connected and await comm.receive_output() == {"type": "websocket.close", "code": 4403}
    await comm.disconnect()
    # the control: alice's own session cookie gets her events
    comm, (connected, _) = await through_the_site(conversation.pk, user=alice)
    assert connected and f'id="event-{events[0].pk}"' in await comm.receive_from()
    await comm.disconnect()


async def test_a_page_on_another_site_cannot_open_the_socket_with_the_owners_cookie(trail, alice):
    """Cross-site WebSocket hijacking: the browser would send alice's cookie along."""
    conversation, _, _ = trail
    comm, (connected, _) = await through_the_site(conversation.pk, user=alice, origin=b"https://evil.example")
    assert not connected
    await comm.disconnect()


async def test_owner_gets_every_event_in_order(trail, alice):
    conversation, _, events = trail
    comm = communicator(conversation.pk, alice)
    connected, _ = await comm.connect()
    assert connected
    html = await comm.receive_from()
    positions = [html.index(f'id="event-{e.pk}"') for e in events]
    assert positions == sorted(positions)
    assert 'hx-swap-oob="beforeend:#timeline"' in html  # the turn group is created first
    assert 'id="messages"' in html and 'id="agent-graph"' not in html
    assert only_busy_panels(panels := await comm.receive_from()) and 'id="agent-graph"' in panels  # on their lane
    await comm.disconnect()


async def test_replay_steps_back_from_the_last_id_to_what_had_settled_then(alice, monkeypatch):
    """The page sends the largest event id it holds (static/js/live.js), on every connect.
    An event created less than SETTLE_SECONDS before that one may have committed after the
    page read it (PostgreSQL: the last test here), so it comes again, even when the
    page was away long enough for both to settle; what had settled by then does not."""
    monkeypatch.setattr(live, "SETTLE_SECONDS", 1.0)
    conversation = await database_sync_to_async(conversation_for)(alice)
    turn = await database_sync_to_async(turn_for)(conversation)

    def record(summary: str) -> Event:
        return Event.objects.create(conversation=conversation, turn=turn,
                                    type="orchestrator.llm_call", summary=summary)

    old = await database_sync_to_async(record)("old")
    await asyncio.sleep(1.2)
    close, held = [await database_sync_to_async(record)(summary) for summary in ("close", "held")]
    after = await database_sync_to_async(record)("after")
    await asyncio.sleep(1.2)  # the page was away: everything has settled by now

    comm = communicator(conversation.pk, alice, last=held.pk)
    await comm.connect()
    html = await comm.receive_from()
    assert [int(i) for i in re.findall(r'id="event-(\d+)"', html)] == [close.pk, held.pk, after.pk]
    assert f'id="event-{old.pk}"' not in html
    await comm.disconnect()


async def test_live_event_is_pushed_once(trail, alice):
    conversation, turn, events = trail
    comm = communicator(conversation.pk, alice, last=events[-1].pk)
    await comm.connect()
    await comm.receive_from()  # the events just before `last` again: they have not settled
    assert await nothing_but_busy_panels(comm)
    new = await database_sync_to_async(
        lambda: event_record(type="turn.completed", turn=turn, summary="Turn 1 answered")
    )()
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{new.pk}"' in html
    assert html.count(f'id="event-{new.pk}"') == 1
    assert await nothing_but_busy_panels(comm, timeout=0.6)  # the poll does not send it again
    await comm.disconnect()


async def test_a_push_does_not_wait_for_the_thread_the_process_shares(trail, alice, settings):
    """channels hands every message a consumer receives to the process's one shared sync
    thread first (`close_old_connections`), where every socket's messages queue, and each
    connecting socket's user lookup. These handlers use no connection of that thread:
    with it busy, an event still reaches the page."""
    settings.ASSISTANT_SOCKET_POLL_SECONDS = 60  # only the group message can bring the event
    conversation, turn, events = trail
    comm = communicator(conversation.pk, alice, last=events[-1].pk)
    await comm.connect()
    await comm.receive_from()
    assert await nothing_but_busy_panels(comm)
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)())  # the shared thread, e.g. a slow user lookup

    def record() -> Event:
        try:
            return event_record(type="turn.completed", turn=turn, summary="Turn 1 answered")
        finally:
            connection.close()

    try:
        new = await sync_to_async(record, thread_sensitive=False)()
        assert f'id="event-{new.pk}"' in await next_rows(comm, timeout=3)
    finally:
        release.set()
        await busy
    await comm.disconnect()


async def test_nonsense_last_id_replays_everything(trail, alice):
    conversation, _, events = trail
    comm = communicator(conversation.pk, alice)
    comm.scope["query_string"] = b"last=abc"
    await comm.connect()
    html = await comm.receive_from()
    assert all(f'id="event-{e.pk}"' in html for e in events)
    await comm.disconnect()


@pytest.mark.postgres
async def test_an_event_committed_after_the_page_rendered_a_bigger_id_still_arrives(alice):
    """PostgreSQL takes ids at insert: `late` gets the smaller id but commits after the page
    rendered `early`. The page's socket replays from a settled id, so `late` reaches it."""
    conversation = await database_sync_to_async(conversation_for)(alice)
    turn = await database_sync_to_async(turn_for)(conversation)
    with LateCommit(conversation, turn) as late:
        early = await database_sync_to_async(Event.objects.create)(
            conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="early")

        def render_page() -> str:
            client = Client()
            client.force_login(alice)
            return client.get(conversation.get_absolute_url()).content.decode()

        page = await database_sync_to_async(render_page)()
    assert late["event"].pk < early.pk
    assert f'id="event-{early.pk}"' in page and f'id="event-{late["event"].pk}"' not in page

    comm = communicator(conversation.pk, alice, last=int(re.search(r"\?last=(\d+)", page).group(1)))
    await comm.connect()
    html = await comm.receive_from(timeout=5)  # the catch-up waits for settling; CI may be busy
    assert f'id="event-{late["event"].pk}"' in html
    await comm.disconnect()


@pytest.mark.postgres
async def test_an_event_committed_while_the_page_was_away_arrives_on_reconnect(alice, monkeypatch):
    """`late` takes the smaller id but commits after the socket sent `early`, while the page
    is away. When it reconnects, with its largest id `early`, both have settled, yet `late`
    must still arrive: the socket steps back to what had settled when `early` was created."""
    monkeypatch.setattr(live, "SETTLE_SECONDS", 0.5)
    conversation = await database_sync_to_async(conversation_for)(alice)
    turn = await database_sync_to_async(turn_for)(conversation)
    with LateCommit(conversation, turn) as late:
        early = await database_sync_to_async(Event.objects.create)(
            conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="early")
        comm = communicator(conversation.pk, alice, last=0)
        await comm.connect()
        html = await comm.receive_from()
        await comm.disconnect()
    assert late["event"].pk < early.pk
    assert f'id="event-{early.pk}"' in html and f'id="event-{late["event"].pk}"' not in html
    await asyncio.sleep(1.0)  # longer than SETTLE_SECONDS: both have settled

    comm = communicator(conversation.pk, alice, last=early.pk)
    await comm.connect()
    html = await comm.receive_from()
    assert f'id="event-{late["event"].pk}"' in html
    await comm.disconnect()
