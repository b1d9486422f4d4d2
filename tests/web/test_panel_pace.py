"""The busy panels' pace (assistant/live.py BUSY_PANELS): while a turn's events keep
coming, a socket sends the counters, the agent graph and the waterfall at most once per
ASSISTANT_PANEL_INTERVAL_SECONDS (the waterfall every third), on a lane of their own;
each event row at once, and what it held back soon after, without another event to
carry it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channels.db import database_sync_to_async

from assistant import live, pooled
from assistant.live import BUSY_PANELS, Cursor
from orchestration.records.catalogue import AGENT_LLM_CALL, TURN_COMPLETED
from orchestration.records.events import event_record
from tests.factories import conversation_for, turn_for
from tests.sockets import communicator, nothing_but_busy_panels

pytestmark = pytest.mark.django_db(transaction=True)

GRAPH = 'id="agent-graph"'


def test_the_busy_lane_spends_at_most_its_share_of_a_core(settings, monkeypatch):
    """Each render on the lane waits until its predecessor's CPU time is at most the
    share of the time since that one began: a 10 ms render at a tenth of a core, then
    the next no sooner than 90 ms after it ended. The thread's own CPU, not the wall
    clock: waiting for the database or the GIL costs the lane no turn."""
    settings.ASSISTANT_PANEL_CPU_SHARE = 0.1
    clock = {"wall": 100.0, "cpu": 5.0}
    slept = []

    def sleep(seconds):
        slept.append(round(seconds, 6))
        clock["wall"] += seconds

    monkeypatch.setattr(pooled.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(pooled.time, "thread_time", lambda: clock["cpu"])
    monkeypatch.setattr(pooled.time, "sleep", sleep)

    def render(cpu, wall):
        clock["cpu"] += cpu
        clock["wall"] += wall
        return "html"

    lane = pooled.Paced("ASSISTANT_PANEL_CPU_SHARE")(render)
    assert lane(0.010, 0.030) == "html" and slept == []  # the first at once
    lane(0.002, 0.002)
    assert slept == [0.09]  # 10 ms of CPU: 90 ms before the next
    clock["wall"] += 1.0  # an idle lane: the next one at once
    settings.ASSISTANT_PANEL_CPU_SHARE = 1.0  # no limit
    lane(0.010, 0.010)
    lane(0.010, 0.010)
    assert slept == [0.09]


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


async def test_a_socket_sends_rows_at_once_and_the_busy_panels_on_their_own_lane(alice, settings):
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
    assert f'id="event-{first}"' in html and GRAPH not in html  # the row alone, at once
    html = await comm.receive_from(timeout=3)  # then the busy panels, on their lane
    assert GRAPH in html and 'id="counters"' in html and 'id="event-' not in html
    second = await database_sync_to_async(record)(AGENT_LLM_CALL, "step 2")
    sent_at = time.monotonic()
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{second}"' in html and GRAPH not in html  # the row at once, the graph held back
    html = await comm.receive_from(timeout=3)  # no event meanwhile: the socket sends what it owes
    assert GRAPH in html and 'id="event-' not in html and time.monotonic() - sent_at < 2
    done = await database_sync_to_async(record)(TURN_COMPLETED, "answered")
    html = await comm.receive_from(timeout=3)
    assert f'id="event-{done}"' in html and 'id="messages"' in html  # the chat follows its events at once
    assert 'id="counters"' in await comm.receive_from(timeout=3)  # the turn came to rest: its state at once
    await comm.disconnect()


async def test_a_row_does_not_wait_for_the_busy_panels(alice, settings, monkeypatch):
    """The busy panels' lane held up (a slow render, a saturated process): the next
    event's row still goes out at once, and the panels follow once the lane is free,
    what was owed meanwhile joined into one render."""
    settings.ASSISTANT_PANEL_INTERVAL_SECONDS = 0
    settings.ASSISTANT_PUSH_INTERVAL_SECONDS = 0
    conversation = await database_sync_to_async(conversation_for)(alice)
    turn = await database_sync_to_async(turn_for)(conversation)
    lane_free, renders = threading.Event(), []
    real = live.panel_context

    def slow(conversation, panels=frozenset(live.PANELS)):
        if panels & BUSY_PANELS.keys():
            renders.append(panels)
            lane_free.wait(timeout=10)
        return real(conversation, panels)

    monkeypatch.setattr(live, "panel_context", slow)

    def record(summary: str):
        return event_record(type=AGENT_LLM_CALL, turn=turn, summary=summary).pk

    comm = communicator(conversation.pk, alice)
    assert (await comm.connect())[0]
    assert 'id="answer-draft"' in await comm.receive_from(timeout=3)
    first = await database_sync_to_async(record)("step 1")
    assert f'id="event-{first}"' in await comm.receive_from(timeout=3)
    for _ in range(300):  # the busy panels' render begins, and is held
        if renders:
            break
        await asyncio.sleep(0.01)
    second = await database_sync_to_async(record)("step 2")
    assert f'id="event-{second}"' in await comm.receive_from(timeout=3)  # while the lane is held
    assert len(renders) == 1
    lane_free.set()
    for _ in range(2):  # the held render, then what both steps owed, in one
        assert GRAPH in await comm.receive_from(timeout=3)
    assert await comm.receive_nothing(timeout=0.3) and len(renders) == 2
    await comm.disconnect()


async def test_a_hidden_tab_is_sent_nothing_until_it_shows(alice, settings):
    """The page says when its tab hides (static/js/live.js): the socket sends it nothing
    meanwhile, and when it shows, one push of every row it missed (read from the log),
    then one render of the busy panels. Anything else a browser sends changes nothing."""
    settings.ASSISTANT_PANEL_INTERVAL_SECONDS = 0
    settings.ASSISTANT_PUSH_INTERVAL_SECONDS = 0
    conversation = await database_sync_to_async(conversation_for)(alice)
    turn = await database_sync_to_async(turn_for)(conversation)

    def record(summary: str):
        return event_record(type=AGENT_LLM_CALL, turn=turn, summary=summary).pk

    comm = communicator(conversation.pk, alice)
    assert (await comm.connect())[0]
    assert 'id="answer-draft"' in await comm.receive_from(timeout=3)
    for junk in ("visible", '{"visible": "no"}', '["visible", false]', '{"visible": 0}',
                 '{"visible": false' + " " * 100 + "}"):
        await comm.send_to(text_data=junk)
    first = await database_sync_to_async(record)("step 1")
    assert f'id="event-{first}"' in await comm.receive_from(timeout=3)
    assert GRAPH in await comm.receive_from(timeout=3)  # still visible: the junk changed nothing
    assert await nothing_but_busy_panels(comm, timeout=0.3)  # a render still in flight goes out

    await comm.send_to(text_data='{"visible": false}')
    hidden = [await database_sync_to_async(record)(f"step {n}") for n in (2, 3)]
    assert await comm.receive_nothing(timeout=0.5)  # hidden: no rows, no panels

    await comm.send_to(text_data='{"visible": true}')
    rows = await comm.receive_from(timeout=3)
    assert all(f'id="event-{pk}"' in rows for pk in hidden) and f'id="event-{first}"' not in rows
    html = await comm.receive_from(timeout=3)
    assert GRAPH in html and 'id="counters"' in html and 'id="event-' not in html
    assert await comm.receive_nothing(timeout=0.3)  # one push and one render for all it missed
    await comm.send_to(text_data='{"visible": true}')  # no change: nothing owed, nothing sent
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()
