"""How a worker's events reach the web processes through Redis, and at what cost.

A web process is pushed its conversations' messages (pub/sub): receiving a burst costs
Redis no command per message. channels_redis's default layer pulled them one at a time,
four round trips each, behind one lock for all of a process's sockets; under `make load`
its queue fell seconds behind the workers (assistant/databases.py). And a worker does not
wait for its pushes: a slow Redis holds no step."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from redis.asyncio.connection import AbstractConnection

from orchestration.records import events

needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs the Redis channel layer")

BURST = 50


@pytest.fixture
def redis_commands(monkeypatch):
    """Every command this process sends Redis (one packed command per call)."""
    sent: list = []
    send = AbstractConnection.send_packed_command

    async def counting(self, command, check_health=True):
        sent.append(command)
        return await send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return sent


@needs_redis
async def test_a_burst_of_group_messages_costs_redis_one_command_each_to_send_and_none_to_receive(redis_commands):
    layer = get_channel_layer()
    group = f"conversation-test-{uuid.uuid4().hex}"
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    try:
        await layer.group_send(group, {"type": "event.created", "event_id": -1})  # connects
        assert (await layer.receive(channel))["event_id"] == -1
        connected = len(redis_commands)
        for number in range(BURST):
            await layer.group_send(group, {"type": "event.created", "event_id": number})
        received = [(await layer.receive(channel))["event_id"] for _ in range(BURST)]
        commands = redis_commands[connected:]
    finally:
        await layer.group_discard(group, channel)
        await layer.flush()

    assert received == list(range(BURST))  # every one, in order
    assert len(commands) == BURST  # the publishes


class HeldLayer:
    """A channel layer whose sends wait until `release` is set: a Redis slow to answer."""

    def __init__(self):
        self.release = threading.Event()
        self.sent: list[dict] = []

    async def group_send(self, group: str, message: dict) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 30)
        self.sent.append(message)


def test_a_worker_does_not_wait_for_redis_to_take_its_notices_which_leave_in_order(monkeypatch):
    layer = HeldLayer()
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    for number in range(3):
        events.group_notify(1, {"type": "event.created", "event_id": number})  # what a commit's callback calls
    assert layer.sent == []  # all three handed over while the first is still held

    layer.release.set()
    deadline = time.monotonic() + 10
    while len(layer.sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [message["event_id"] for message in layer.sent] == [0, 1, 2]


@needs_redis
async def test_a_workers_notices_reach_a_web_process_through_redis_in_the_order_they_were_committed():
    layer = get_channel_layer()
    conversation_id = uuid.uuid4().int % 10**9
    channel = await layer.new_channel()
    await layer.group_add(events.group_name(conversation_id), channel)
    try:
        def commit_callbacks():  # a worker's commits, one after another (a thread of its own)
            for number in range(BURST):
                events.group_notify(conversation_id, {"type": "event.created", "event_id": number})

        await asyncio.to_thread(commit_callbacks)
        received = [(await asyncio.wait_for(layer.receive(channel), 10))["event_id"] for _ in range(BURST)]
    finally:
        await layer.group_discard(events.group_name(conversation_id), channel)
        await layer.flush()
    assert received == list(range(BURST))


@needs_redis
async def test_deployments_sharing_a_redis_do_not_see_each_others_conversations():
    """Two deployments (one database each) on one Redis, each with a conversation number
    7: a web process of one gets only its own deployment's events."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    from assistant.databases import channel_layers_from_url, channel_prefix

    def layer_of(database_name: str) -> RedisPubSubChannelLayer:
        database = {"ENGINE": "django.db.backends.postgresql", "HOST": "db.example", "NAME": database_name}
        config = channel_layers_from_url(settings.REDIS_URL, prefix=channel_prefix(database))["default"]["CONFIG"]
        return RedisPubSubChannelLayer(**config)

    ours, theirs, our_worker = layer_of("ours"), layer_of("theirs"), layer_of("ours")
    group = events.group_name(7)
    channel = await ours.new_channel()
    await ours.group_add(group, channel)
    try:
        await theirs.group_send(group, {"type": "event.created", "from": "theirs"})
        await our_worker.group_send(group, {"type": "event.created", "from": "ours"})
        assert (await asyncio.wait_for(ours.receive(channel), timeout=5))["from"] == "ours"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ours.receive(channel), timeout=0.3)
    finally:
        await ours.group_discard(group, channel)
        for layer in (ours, theirs, our_worker):
            await layer.flush()
