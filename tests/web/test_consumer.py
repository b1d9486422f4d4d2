"""The dashboard socket: auth, ownership, replay after the last id, order, live pushes."""

from __future__ import annotations

import re
import threading

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.test import Client

from assistant.routing import websocket_urlpatterns
from orchestration.events import event_record
from orchestration.models import Event
from tests.factories import conversation_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)

application = URLRouter(websocket_urlpatterns)


def communicator(conversation_id: int, user=None, last: int | None = None) -> WebsocketCommunicator:
    path = f"/ws/conversations/{conversation_id}/" + (f"?last={last}" if last is not None else "")
    comm = WebsocketCommunicator(application, path)
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": {"conversation_id": conversation_id}}
    return comm


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


async def test_other_users_socket_is_closed_4403(trail, bob):
    conversation, _, _ = trail
    comm = communicator(conversation.pk, bob)
    await comm.connect()
    assert (await comm.receive_output())["code"] == 4403


@pytest.mark.parametrize("conversation_id", [10**6, 2**63], ids=["missing", "beyond-bigint"])
async def test_a_conversation_that_does_not_exist_is_closed_4403(trail, alice, conversation_id):
    """The same close as for someone else's conversation: the socket tells no id apart."""
    comm = communicator(conversation_id, alice)
    await comm.connect()
    assert await comm.receive_output() == {"type": "websocket.close", "code": 4403}


async def test_staff_cannot_follow_someone_elses_conversation_live(trail, staff):
    """Staff read audit trails (a page), not the owner's live chat."""
    conversation, _, _ = trail
    comm = communicator(conversation.pk, staff)
    await comm.connect()
    assert (await comm.receive_output())["code"] == 4403


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
    comm, (connected, _) = await through_the_site(conversation.pk)
    assert connected and await comm.receive_output() == {"type": "websocket.close", "code": 4403}
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
    assert 'id="agent-graph"' in html and 'id="messages"' in html
    await comm.disconnect()


async def test_replay_starts_after_the_last_id(trail, alice):
    conversation, _, events = trail
    comm = communicator(conversation.pk, alice, last=events[1].pk)
    await comm.connect()
    html = await comm.receive_from()
    assert f'id="event-{events[2].pk}"' in html
    assert f'id="event-{events[0].pk}"' not in html and f'id="event-{events[1].pk}"' not in html
    await comm.disconnect()


async def test_live_event_is_pushed_once(trail, alice):
    conversation, turn, events = trail
    comm = communicator(conversation.pk, alice, last=events[-1].pk)
    await comm.connect()
    assert await comm.receive_nothing(timeout=0.5)
    new = await database_sync_to_async(
        lambda: event_record(type="turn.completed", turn=turn, summary="Turn 1 answered")
    )()
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{new.pk}"' in html
    assert html.count(f'id="event-{new.pk}"') == 1
    assert await comm.receive_nothing(timeout=0.6)  # the poll does not send it again
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
    inserted, release, late = threading.Event(), threading.Event(), {}

    def slow_writer():
        try:
            with transaction.atomic():
                late["event"] = Event.objects.create(conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="late")
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    try:
        assert inserted.wait(10)
        early = await database_sync_to_async(Event.objects.create)(
            conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="early")

        def render_page() -> str:
            client = Client()
            client.force_login(alice)
            return client.get(conversation.get_absolute_url()).content.decode()

        page = await database_sync_to_async(render_page)()
    finally:
        release.set()
        writer.join()
    assert late["event"].pk < early.pk
    assert f'id="event-{early.pk}"' in page and f'id="event-{late["event"].pk}"' not in page

    comm = communicator(conversation.pk, alice, last=int(re.search(r"\?last=(\d+)", page).group(1)))
    await comm.connect()
    html = await comm.receive_from()
    assert f'id="event-{late["event"].pk}"' in html
    await comm.disconnect()
