"""A step that waits on something slow keeps its lease: the lease says whether the worker
lives, not whether a step is quick. A worker whose agent waited on an MCP server
starting (its tools listed for the prompt) longer than the lease used to lose the agent
to the reaper, again in each fresh worker process, until it was dead-lettered.

On a real runner, with a real role's lease on the test database; the reaper runs while
the step still waits."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestration.delivery import runner as runner_module
from orchestration.delivery.runner import Runner
from orchestration.engine import loop
from orchestration.engine.agent import Agent
from orchestration.engine.orchestrator import Orchestrator
from orchestration.lifecycle.reaper import reap_expired
from orchestration.models import AgentDispatch, Turn, TurnStatus
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 1.2  # renewed every 0.4 s: a renewal may come 0.8 s late on a busy machine


@pytest.fixture
def on_runner(settings, monkeypatch):
    """Run a coroutine on a real runner's loop, as a qcluster worker's steps run."""
    settings.ASSISTANT_LEASE_SECONDS = LEASE
    runner = Runner(capacity=2, db_threads=2, skill_threads=1)
    monkeypatch.setattr(runner_module, "_runner", runner)

    def run(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, runner.loop).result(timeout=30)

    yield run
    runner.drain(finish_within=1, call_within=1)


def claimed(role: str, alice):
    if role == "orchestrator":
        turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
        return Orchestrator.claim(turn.pk), lambda: Turn.objects.get(pk=turn.pk)
    # An agent's turn has its orchestrator at work elsewhere (its results call overlaps
    # the agents), under a lease of its own: unleased, the turn would be the reaper's to
    # queue, and its step (with no messages) would fail the turn and stop the agent.
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING, lease_token="orchestrator-elsewhere",
                    lease_expires_at=timezone.now() + timedelta(hours=1))
    dispatch = dispatch_for(turn, "clerk")
    return Agent.claim(dispatch.pk), lambda: AgentDispatch.objects.get(pk=dispatch.pk)


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_a_step_that_waits_past_its_lease_keeps_it(on_runner, alice, role):
    work, row = claimed(role, alice)
    token = row().lease_token

    def slow_listing():  # as a fresh worker starting an MCP server to list its tools
        time.sleep(2 * LEASE)
        return reap_expired()

    found = on_runner(loop._kept(work, runner_module.db, slow_listing))

    assert found["crashes"] == 0, found
    held = row()
    assert (held.lease_token, held.crashes) == (token, 0)


def test_a_quick_step_costs_no_renewal(on_runner, alice, monkeypatch, settings):
    settings.ASSISTANT_LEASE_SECONDS = 30  # however slow the machine, the step is done long before 10 s
    work, _ = claimed("agent", alice)
    checks = []
    monkeypatch.setattr(work, "check", lambda: checks.append(1))

    assert on_runner(loop._kept(work, runner_module.db, lambda: "done")) == "done"
    assert checks == []
