"""A benchmark, not a timed test: how long from an event's commit to its row in the page.

It prints the figures (and keeps them in test-artifacts/browser/latency.json) for the
setup it runs on: the embedded default (in-memory channel layer: the socket polls the
event log every 0.25 s) or, with REDIS_URL, channels_redis pushes.

- delivery: this process commits events one by one (a few dozen a second, as a busy
  turn does) and notes each commit's time; nothing else runs. This is commit → row.
- during turns: the events of real turns run by the cluster, from `Event.created_at`
  (taken just before the INSERT) — so it adds the rest of the worker's transaction,
  including waits for the turn's row lock, to the delivery time.

The end is when a MutationObserver in the page sees the `#event-<id>` row added (chromium's
`performance.timeOrigin + performance.now()`: the same clock, on the same machine).
"""

from __future__ import annotations

import json
import statistics

import pytest
from django.conf import settings
from django.db import connection

from orchestration.models import Event, TurnStatus
from tests.browser.conftest import ARTIFACTS, assert_timeline_complete, record_events, wait_turn
from tests.factories import turn_for
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROW_CLOCK = """
window.__rowSeen = {};
new MutationObserver(records => {
  const now = performance.timeOrigin + performance.now();
  for (const record of records) {
    for (const node of record.addedNodes) {
      if (node.nodeType !== Node.ELEMENT_NODE) continue;
      const rows = node.matches('[id^="event-"]') ? [node] : node.querySelectorAll('[id^="event-"]');
      for (const row of rows) if (!(row.id in window.__rowSeen)) window.__rowSeen[row.id] = now;
    }
  }
}).observe(document, {childList: true, subtree: true});
"""
TURNS = 3
COMMITS = 150


def setup_name() -> str:
    layer = "channels_redis" if "Redis" in settings.CHANNEL_LAYERS["default"]["BACKEND"] else "in-memory layer"
    return f"{connection.vendor} + {layer}"


def figures(delays_ms: list[float]) -> dict:
    ordered = sorted(delays_ms)
    return {
        "events": len(ordered),
        "median_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 1),
        "max_ms": round(ordered[-1], 1),
    }


def test_commit_to_row_latency(servers, visit, alice, llm, capsys):
    search = ("tasks.search", {"status": "open"})
    llm.latency = 0.05
    llm.respond = Plan([Agent(f"w{i}", ["tasks.search"], [search] * 3) for i in range(5)], answer="Measured.")
    site = servers(workers=4)
    alice_tab = visit(site, "alice", init_script=ROW_CLOCK)
    conversation_id = alice_tab.new_conversation()
    opened_ms = alice_tab.page.evaluate("performance.timeOrigin + performance.now()")

    for number in range(1, TURNS + 1):
        alice_tab.send(f"Measure {number}")
        turn = wait_turn(conversation_id, site)
        assert turn.number == number and turn.status == "completed", turn.error
        assert_timeline_complete(alice_tab, conversation_id)  # the page caught up: send again
    during_turns = {event.pk: event.created_at.timestamp() * 1000
                    for event in Event.objects.filter(conversation_id=conversation_id)}

    # a few dozen a second, as a busy turn writes them
    committed = record_events(turn_for(turn.conversation, status=TurnStatus.COMPLETED), COMMITS,
                              spacing=(0.01, 0.05))
    assert_timeline_complete(alice_tab, conversation_id)

    seen = alice_tab.page.evaluate("window.__rowSeen")
    results = {
        "setup": setup_name(),
        "delivery": figures([seen[f"event-{pk}"] - at for pk, at in committed.items()]),
        "during_turns": figures([seen[f"event-{pk}"] - at for pk, at in during_turns.items() if at > opened_ms]),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "latency.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded[results["setup"]] = results
    path.write_text(json.dumps(recorded, indent=2))
    with capsys.disabled():
        print(f"\nevent → row in the browser, {results['setup']}:")
        for name, label in (("delivery", "commit → row"), ("during_turns", "insert → row, real turns")):
            f = results[name]
            print(f"  {label:<26} {f['events']:>4} events  median {f['median_ms']:>6} ms  "
                  f"p95 {f['p95_ms']:>6} ms  max {f['max_ms']:>6} ms")
