"""An MCP side effect across a worker's death, through a real qcluster: the test MCP
server runs over stdio as a child of the worker that calls it, and that worker is
SIGKILLed after the call was sent and before its answer was stored.

Nobody knows then whether the ticket was created; the engine must not send the call
again on its own. The turn asks the owner, and the ticket exists once or not at all, as
the owner decides: "go on as if it failed" after a call that did happen leaves its one
ticket; "send it again" after a call that did not happen creates it once."""

from __future__ import annotations

import os
import signal
import time

import pytest

from orchestration.lifecycle.reaper import reap_expired
from orchestration.lifecycle.turns import turn_start
from orchestration.models import SkillApproval, SkillExecution
from orchestration.questions.approvals import approval_answer
from tests.factories import conversation_for
from tests.live.conftest import LEASE_SECONDS, wait_for
from tests.live.test_faults import assert_settled
from tests.support.llm_server import Agent, Plan
from tests.support.mcp_fixtures import lines, stdio_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def reaping_until(predicate, cluster, *, what: str, timeout: float = 90):
    """Wait for `predicate`, running the reaper as its schedule would (every lease)."""
    last = time.monotonic()

    def reaped():
        nonlocal last
        if time.monotonic() - last > LEASE_SECONDS:
            reap_expired()
            last = time.monotonic()
        return predicate()

    return wait_for(reaped, timeout=timeout, what=what, cluster=cluster)


@pytest.mark.parametrize("lost, choice, tickets", [
    ("hold-once", "go on as if it failed", 1),  # it happened; the owner does not send it again
    ("drop-once", "send it again", 1),  # it did not happen; the owner sends it again
])
def test_a_worker_killed_after_an_mcp_side_effect_was_sent_asks_the_owner(lost, choice, tickets, llm, qcluster,
                                                                           alice, tmp_path, settings):
    settings.ASSISTANT_MCP_CONFIG_SECONDS = 0
    stdio_server(write_policy="allow")
    (tmp_path / lost).touch()
    llm.respond = Plan([Agent("clerk", ["mcp.tools.create_ticket"], [("mcp.tools.create_ticket",
                                                                      {"title": "Printer jam"})],
                              report="Filed.")], answer="Filed the ticket.")
    cluster = qcluster(workers=2, env={"MCP_TEST_DIR": str(tmp_path)})
    turn = turn_start(conversation=conversation_for(alice), text="File a ticket about the printer")

    (received,) = wait_for(lambda: lines(tmp_path / "received.jsonl"), timeout=60, what="the call to reach the server",
                           cluster=cluster)
    worker = received["parent"]
    assert worker in cluster.descendants(), "the stdio server is a child of the worker that called it"
    if lost == "hold-once":
        wait_for(lambda: lines(tmp_path / "tickets.jsonl"), timeout=10, what="the ticket", cluster=cluster)
    row = SkillExecution.objects.get(dispatch__turn=turn, skill="mcp.tools.create_ticket")
    assert row.status == "running" and row.sent_at is not None
    os.kill(worker, signal.SIGKILL)

    asked = reaping_until(lambda: SkillApproval.objects.filter(turn=turn, decision="").first(), cluster,
                          what="the turn to ask about the lost call")
    turn.refresh_from_db()
    assert turn.status == "paused" and asked.kind == "in_doubt" and asked.execution_id == row.pk
    assert len(lines(tmp_path / "received.jsonl")) == 1, "the call was sent again before the owner answered"

    approval_answer(turn=turn, user=alice, approval_id=asked.pk, digest=asked.digest,
                    approve=choice == "send it again")
    reaping_until(lambda: turn.refresh_from_db() or turn.status in ("completed", "failed"), cluster,
                  what="the turn to finish")
    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert len(lines(tmp_path / "tickets.jsonl")) == tickets
    row.refresh_from_db()
    assert row.status == ("completed" if choice == "send it again" else "failed")
    assert llm.errors == []
