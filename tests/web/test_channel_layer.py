"""How a worker's events reach the web processes through Redis, and at what cost.

A web process is pushed its conversations' messages (pub/sub): receiving a burst costs
Redis no command per message. channels_redis's default layer pulled them one at a time,
four round trips each, behind one lock for all of a process's sockets; under `make load`
its queue fell seconds behind the workers (assistant/databases.py)."""

from __future__ import annotations

import uuid

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from redis.asyncio.connection import AbstractConnection

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

