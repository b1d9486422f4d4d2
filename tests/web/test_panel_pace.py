"""The busy panels' pace (assistant/live.py BUSY_PANELS): while a turn's events keep
coming, a socket sends the counters, the agent graph and the waterfall at most once per
ASSISTANT_PANEL_INTERVAL_SECONDS (the waterfall every third), each event row at once, and
what it held back soon after, without another event to carry it."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async

from assistant.live import Cursor
from orchestration.records.catalogue import AGENT_LLM_CALL, TURN_COMPLETED
from orchestration.records.events import event_record
from tests.factories import conversation_for, turn_for
from tests.sockets import communicator

pytestmark = pytest.mark.django_db(transaction=True)

GRAPH = 'id="agent-graph"'


def test_a_busy_panel_is_due_once_per_interval_and_owed_meanwhile(settings):
    settings.ASSISTANT_PANEL_INTERVAL_SECONDS = 1.0
    cursor = Cursor(0)
    assert cursor.panels_due(frozenset({"graph", "counters"}), now=10.0) == {"graph", "counters"}
    assert cursor.owed_in is None
    assert cursor.panels_due(frozenset({"graph", "messages"}), now=10.4) == {"messages"}  # the chat at once
    assert cursor.owed == {"graph"} and cursor.owed_in == pytest.approx(0.6)
    assert cursor.panels_due(frozenset(), now=11.0) == {"graph"}  # owed, now due
    assert cursor.owed == frozenset() and cursor.owed_in is None
    assert cursor.panels_due(frozenset({"waterfall"}), now=11.0) == {"waterfall"}
    assert cursor.panels_due(frozenset({"waterfall", "graph"}), now=12.5) == {"graph"}  # the waterfall every 3 s
    assert cursor.owed == {"waterfall"} and cursor.owed_in == pytest.approx(1.5)
    # the turn came to rest: the page shows where it stands at once
    assert cursor.panels_due(frozenset({"graph"}), now=12.6, turn_moved=True) == {"graph", "waterfall"}


async def test_a_socket_sends_rows_at_once_and_the_graph_when_due(alice, settings):
    settings.ASSISTANT_PANEL_INTERVAL_SECONDS = 0.5
    settings.ASSISTANT_PUSH_INTERVAL_SECONDS = 0
    conversation = await database_sync_to_async(conversation_for)(alice)
    turn = await database_sync_to_async(turn_for)(conversation)

    def record(type_: str, summary: str):
        return event_record(type=type_, turn=turn, summary=summary).pk

    comm = communicator(conversation.pk, alice)
    assert (await comm.connect())[0]
    assert 'id="answer-draft"' in await comm.receive_from(timeout=3)  # the running turn's catch-up
    first = await database_sync_to_async(record)(AGENT_LLM_CALL, "step 1")
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{first}"' in html and GRAPH in html
    second = await database_sync_to_async(record)(AGENT_LLM_CALL, "step 2")
    sent_at = time.monotonic()
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{second}"' in html and GRAPH not in html  # the row at once, the graph held back
    html = await comm.receive_from(timeout=3)  # no event meanwhile: the socket sends what it owes
    assert GRAPH in html and 'id="event-' not in html and time.monotonic() - sent_at < 2
    done = await database_sync_to_async(record)(TURN_COMPLETED, "answered")
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{done}"' in html and 'id="messages"' in html  # the chat follows its events at once
    await comm.disconnect()
