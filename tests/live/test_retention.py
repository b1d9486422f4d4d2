"""Deleting a user while their turn runs on a real `qcluster` (issue 18): the worker
holding their agent lets it go when its rows are gone, and the cluster keeps serving
bob, before, during and after; nothing of the deleted user is left in any table.

bob's turn time is measured in the same run (alone, then with alice deleted mid-turn)
and printed, not asserted."""

from __future__ import annotations

import json
import threading
import time

import pytest

from orchestration.models import Turn
from orchestration.reports.retention import user_delete
from orchestration.lifecycle.turns import turn_start
from tests.checks import references
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.orchestration.test_user_delete import user_rows
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEARCH = ("tasks.search", {"status": "open"})
DONE = ("completed", "failed", "paused", "stopped")


def finished(turn: Turn, cluster) -> tuple[Turn, float]:
    started = time.monotonic()
    wait_for(lambda: Turn.objects.filter(pk=turn.pk, status__in=DONE).exists(), timeout=90,
             what=f"turn {turn.pk} to finish", cluster=cluster)
    turn.refresh_from_db()
    return turn, time.monotonic() - started


def test_deleting_a_user_mid_turn_leaves_the_cluster_serving_others(llm, qcluster, alice, bob, settings, tmp_path):
    workspaces = tmp_path / "workspaces"
    settings.SKILLS_WORKSPACE_ROOT = workspaces
    plan = Plan([Agent("finder", ["tasks.search"], [SEARCH])], answer="Found them.", tag_missions=True)
    alice_waiting = threading.Event()

    def respond(request):
        reply = plan(request)
        is_agent = any(tool["function"]["name"] == "use_skill" for tool in request.get("tools", []))
        # alice's agent is mid model call when she is deleted: its answer comes back after.
        if is_agent and "asked:alice" in json.dumps(request["messages"]):
            alice_waiting.set()
            reply.delay = 3
        return reply

    llm.latency = 0.1
    llm.respond = respond
    cluster = qcluster(workers=2, env={"SKILLS_WORKSPACE_ROOT": str(workspaces)})

    alone, alone_s = finished(turn_start(conversation=conversation_for(bob), text="bob: find my tasks"), cluster)
    assert alone.status == "completed", alone.error

    alices = turn_start(conversation=conversation_for(alice), text="alice: find my tasks")
    wait_for(alice_waiting.is_set, timeout=60, what="alice's agent to be in its model call", cluster=cluster)
    rows = user_rows(alice)
    assert rows[Turn] == {alices.pk}
    user_delete(user=alice)
    during, during_s = finished(turn_start(conversation=conversation_for(bob), text="bob: again"), cluster)
    assert during.status == "completed", during.error

    # alice's agent's answer arrives to rows that are gone; the next turn still runs.
    wait_for(lambda: llm.in_flight == 0, timeout=30, what="alice's slow call to return", cluster=cluster)
    after, after_s = finished(turn_start(conversation=conversation_for(bob), text="bob: once more"), cluster)
    assert after.status == "completed", after.error
    assert cluster.process.poll() is None

    assert references(rows) == {}
    assert not (workspaces / str(rows[type(alice)].pop())).exists()
    assert Turn.objects.filter(conversation__owner=bob, status="completed").count() == 3
    print(f"\nbob's turn: {alone_s:.2f} s alone, {during_s:.2f} s right after alice was deleted mid-turn, "
          f"{after_s:.2f} s once her agent's answer had come back")
