"""Cheap sockets (issue 18): one poller per conversation serves all its sockets in a
process, an idle socket reads nothing, and the caps per user and per conversation close
one socket too many with 4429 while other users' sockets open as before.

The CPU figures (idle sockets before and after) are benchmarks/idle_sockets.py's."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from assistant import live, watch
from orchestration.models import Event
from orchestration.records.events import event_record
from tests.factories import conversation_for, turn_for
from tests.sockets import EVENT_ID, communicator, next_rows, nothing_but_busy_panels, only_busy_panels

pytestmark = pytest.mark.django_db(transaction=True)





class Counted:
    """Calls of a method, counted across threads (the pool runs them)."""

    def __init__(self, monkeypatch, owner, name: str):
        self.calls = 0
        original = getattr(owner, name)

        def counting(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)

    async def at_least(self, calls: int) -> None:
        while self.calls < calls:
            await asyncio.sleep(0.01)


def started(user):
    conversation = conversation_for(user)
    turn = turn_for(conversation)
    first = Event.objects.create(conversation=conversation, turn=turn, type="turn.started", summary="Turn 1 started")
    return conversation, turn, first


async def opened(comms: list[WebsocketCommunicator]) -> None:
    for comm in comms:
        assert (await comm.connect())[0]
        assert EVENT_ID.search(await comm.receive_from())  # the catch-up
        assert only_busy_panels(await comm.receive_from())  # and its busy panels, on their lane


async def test_one_poller_reads_the_log_for_every_socket_on_a_conversation(alice, bob, settings, monkeypatch):
    settings.ASSISTANT_SOCKET_POLL_SECONDS = 0.02
    settings.ASSISTANT_SOCKETS_PER_CONVERSATION = 50
    settings.ASSISTANT_SOCKETS_PER_USER = 50
    conversation, turn, _ = await database_sync_to_async(started)(alice)
    bobs, _, _ = await database_sync_to_async(started)(bob)
    probes = Counted(monkeypatch, live.Probe, "changed")
    reads = Counted(monkeypatch, live.Cursor, "new_events")

    sockets = [communicator(conversation.pk, alice) for _ in range(20)]
    await opened(sockets)
    bobs_socket = communicator(bobs.pk, bob)
    await opened([bobs_socket])
    registry = watch.registry()
    assert set(registry.watches) == {conversation.pk, bobs.pk}  # one watch per conversation
    assert len(registry.watches[conversation.pk].sockets) == 20
    assert registry.per_user == {alice.pk: 20, bob.pk: 1}

    # Idle: the watches read the log (one light query each), no socket does.
    await probes.at_least(probes.calls + 4)
    reads_before, probes_before = reads.calls, probes.calls
    await probes.at_least(probes_before + 40)
    idle_probes, idle_reads = probes.calls - probes_before, reads.calls - reads_before
    print(f"\nidle, 21 sockets on 2 conversations: {idle_probes} poller reads, {idle_reads} socket reads")
    assert idle_reads == 0

    # An event written straight to the log (no group message, as from another process
    # without Redis) reaches every socket of alice's conversation exactly once, and
    # nothing reaches bob's.
    event = await database_sync_to_async(Event.objects.create)(
        conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="from a worker")
    for comm in sockets:
        assert EVENT_ID.findall(await comm.receive_from(timeout=5)) == [str(event.pk)]
    await probes.at_least(probes.calls + 10)
    for comm in sockets:
        assert await nothing_but_busy_panels(comm, timeout=0.01)
    assert await nothing_but_busy_panels(bobs_socket, timeout=0.1)

    # The last socket out stops its conversation's watch; bob's carries on.
    task = registry.watches[conversation.pk].task
    for comm in sockets:
        await comm.disconnect()
    await asyncio.sleep(0)
    assert set(registry.watches) == {bobs.pk} and task.cancelled()
    assert registry.per_user == {bob.pk: 1}
    await bobs_socket.disconnect()
    assert not registry.watches and not registry.per_user


async def test_events_a_group_message_brought_wake_no_socket_to_read_the_log(alice, settings, monkeypatch):
    """With Redis the watch is only the safety net: what the group messages brought the
    sockets is no news to it, so a busy turn's events cost no socket a read of the log
    (each used to read it once per poll that saw them). One the messages missed still
    wakes every socket. (A poll that reads an event before its message has arrived
    still wakes them: one read more, as before. The gate holds the watch back here so
    the messages come first.)"""
    settings.ASSISTANT_SOCKET_POLL_SECONDS = 0.02
    conversation, turn, _ = await database_sync_to_async(started)(alice)
    probes = Counted(monkeypatch, live.Probe, "changed")
    reads = Counted(monkeypatch, live.Cursor, "new_events")
    gate, held = asyncio.Event(), asyncio.Event()
    gate.set()
    probe_changed = watch._probe_changed

    async def gated(*args):
        if not gate.is_set():
            held.set()
            await gate.wait()
        return await probe_changed(*args)

    monkeypatch.setattr(watch, "_probe_changed", gated)
    sockets = [communicator(conversation.pk, alice) for _ in range(3)]
    await opened(sockets)
    await probes.at_least(probes.calls + 3)  # its first read, which wakes them all, is done
    gate.clear()
    await held.wait()
    for comm in sockets:
        assert await nothing_but_busy_panels(comm, timeout=0.1)
    reads_before = reads.calls

    for step in range(5):
        event = await database_sync_to_async(event_record)(
            type="orchestrator.llm_call", turn=turn, summary=f"step {step}")  # its row goes in the message
        for comm in sockets:
            assert EVENT_ID.findall(await next_rows(comm, timeout=5)) == [str(event.pk)]
    gate.set()
    await probes.at_least(probes.calls + 3)  # reads that saw them all
    for comm in sockets:
        assert await nothing_but_busy_panels(comm, timeout=0.1)
    assert reads.calls == reads_before

    missed = await database_sync_to_async(Event.objects.create)(
        conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="no message")
    for comm in sockets:
        assert EVENT_ID.findall(await next_rows(comm, timeout=5)) == [str(missed.pk)]
    assert reads.calls == reads_before + len(sockets)
    for comm in sockets:
        await comm.disconnect()


async def test_a_socket_over_the_users_cap_is_closed_4429_and_others_are_unaffected(alice, bob, settings):
    settings.ASSISTANT_SOCKETS_PER_USER = 3
    first, _, _ = await database_sync_to_async(started)(alice)
    second, _, _ = await database_sync_to_async(started)(alice)
    bobs, _, _ = await database_sync_to_async(started)(bob)
    allowed = [communicator(first.pk, alice), communicator(first.pk, alice), communicator(second.pk, alice)]
    await opened(allowed)

    extra = communicator(second.pk, alice)
    assert (await extra.connect())[0]
    closed = await extra.receive_output()
    assert closed["type"] == "websocket.close" and closed["code"] == watch.TOO_MANY == 4429
    assert "3 live pages" in closed["reason"]
    await extra.disconnect()

    # bob has sockets of his own to open
    bobs_sockets = [communicator(bobs.pk, bob) for _ in range(3)]
    await opened(bobs_sockets)
    # alice closes a tab: a new one opens
    await allowed.pop().disconnect()
    again = communicator(second.pk, alice)
    await opened([again])
    assert watch.registry().per_user == {alice.pk: 3, bob.pk: 3}
    for comm in [*allowed, again, *bobs_sockets]:
        await comm.disconnect()
    assert not watch.registry().watches


async def test_a_socket_over_the_conversations_cap_is_closed_4429(alice, settings):
    settings.ASSISTANT_SOCKETS_PER_CONVERSATION = 2
    busy, _, _ = await database_sync_to_async(started)(alice)
    other, _, _ = await database_sync_to_async(started)(alice)
    allowed = [communicator(busy.pk, alice), communicator(busy.pk, alice)]
    await opened(allowed)

    extra = communicator(busy.pk, alice)
    await extra.connect()
    closed = await extra.receive_output()
    assert closed["code"] == 4429 and "on this conversation" in closed["reason"]
    await extra.disconnect()

    elsewhere = communicator(other.pk, alice)  # another conversation of hers is its own count
    await opened([elsewhere])
    for comm in [*allowed, elsewhere]:
        await comm.disconnect()
    assert not watch.registry().watches and not watch.registry().per_user


@pytest.mark.postgres
async def test_an_event_that_commits_late_reaches_every_socket_through_the_poller(alice, settings):
    """PostgreSQL takes ids at insert: `late` gets the smaller id but commits after `early`
    was polled and sent. The one poller still notices it and each socket's own cursor
    sends it, once — with no group message for either (as from another process without
    Redis)."""
    from tests.web.test_consumer import LateCommit

    settings.ASSISTANT_SOCKET_POLL_SECONDS = 0.02
    conversation, turn, _ = await database_sync_to_async(started)(alice)
    sockets = [communicator(conversation.pk, alice) for _ in range(3)]
    await opened(sockets)
    with LateCommit(conversation, turn) as late:
        early = await database_sync_to_async(Event.objects.create)(
            conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="early")
        for comm in sockets:
            assert EVENT_ID.findall(await next_rows(comm, timeout=5)) == [str(early.pk)]
    assert late["event"].pk < early.pk
    for comm in sockets:
        assert EVENT_ID.findall(await next_rows(comm, timeout=5)) == [str(late["event"].pk)]
        assert await nothing_but_busy_panels(comm, timeout=0.2)
    for comm in sockets:
        await comm.disconnect()


async def test_a_conversation_with_every_tab_hidden_is_not_polled(alice, settings, monkeypatch):
    """Nobody looks at a conversation whose every page is in a background tab: its
    watch reads nothing until one shows, and that one reads what it missed from the log
    (here an event with no group message, as from another process without Redis)."""
    settings.ASSISTANT_SOCKET_POLL_SECONDS = 0.02
    conversation, turn, _ = await database_sync_to_async(started)(alice)
    probes = Counted(monkeypatch, live.Probe, "changed")
    tabs = [communicator(conversation.pk, alice) for _ in range(2)]
    await opened(tabs)

    await tabs[0].send_to(text_data='{"visible": false}')
    await probes.at_least(probes.calls + 5)  # one tab still in view: still read
    await tabs[1].send_to(text_data='{"visible": false}')
    await asyncio.sleep(0.1)
    idle = probes.calls
    missed = await database_sync_to_async(Event.objects.create)(
        conversation=conversation, turn=turn, type="orchestrator.llm_call", summary="while hidden")
    await asyncio.sleep(0.4)  # twenty polls' time
    assert probes.calls - idle <= 1  # (one in flight as the last tab hid, at most)
    assert await tabs[0].receive_nothing(timeout=0.05)

    await tabs[0].send_to(text_data='{"visible": true}')
    assert EVENT_ID.findall(await next_rows(tabs[0], timeout=5)) == [str(missed.pk)]
    await probes.at_least(idle + 5)  # a tab in view: read again
    assert await tabs[1].receive_nothing(timeout=0.1)  # still hidden: sent nothing
    for comm in tabs:
        await comm.disconnect()
    assert not watch.registry().watches
