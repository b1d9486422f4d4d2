"""Agents that become ready together start together (issue 27): the agents of one dispatch
answer are claimed in one transaction of three statements, not one by one on the
process's database threads, and a claim of several keeps every guarantee of a claim of
one — a second delivery claims nothing, an agent of a paused turn is left for the
schedule, a resumed agent says why — and on a real runner the eight agents of a `wide`
answer start in one claim."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestration.delivery import queue
from orchestration.engine import loop
from orchestration.engine.agent import Agent
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.models import AgentDispatch, DispatchState, Event, Turn, TurnStatus
from tests.factories import conversation_for, dispatch_for, turn_for
from tests.support.statements import CONTROL

pytestmark = pytest.mark.django_db(transaction=True)


def statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if not CONTROL.match(q["sql"])]


@pytest.fixture
def ready(alice):
    turn = turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    return turn, [dispatch_for(turn, f"a{i}") for i in range(1, 5)]


def test_agents_ready_together_are_claimed_in_one_transaction(ready):
    turn, dispatches = ready
    ids = [d.pk for d in dispatches]
    with CaptureQueriesContext(connection) as queries:
        claimed = Agent.claim_many(ids)
    # Read them, move them, their events, their first calls counted; and the owner's caps.
    assert len(statements(queries)) == 5, statements(queries)
    assert set(claimed) == set(ids)
    turn.refresh_from_db()
    assert turn.agent_llm_calls == 4 and all(agent.counted for agent in claimed.values())
    assert len({id(agent.spend.caps) for agent in claimed.values()}) == 1 and claimed[ids[0]].spend.caps.unlimited
    rows = {d.pk: d for d in AgentDispatch.objects.filter(pk__in=ids)}
    assert {rows[pk].state for pk in ids} == {DispatchState.RUNNING}
    assert len({rows[pk].lease_token for pk in ids}) == 4  # each its own lease
    for pk, agent in claimed.items():
        assert agent.token == rows[pk].lease_token and agent.dispatch.state == DispatchState.RUNNING
        assert rows[pk].deadline_at > rows[pk].started_at and rows[pk].queued_at is None
    started = Event.objects.filter(turn=turn, type="agent.subagent_started")
    assert sorted(started.values_list("dispatch_id", flat=True)) == sorted(ids)

    assert Agent.claim_many(ids) == {}  # a second delivery claims nothing
    assert started.count() == 4


def test_first_calls_that_would_pass_the_turns_cap_are_counted_one_by_one(ready):
    """Near the cap the claim counts nothing: each agent counts its own call before making
    it, and those past the cap trip the limit the usual way (a pause)."""
    turn, dispatches = ready
    Turn.objects.filter(pk=turn.pk).update(limits={**turn.limits, "turn_max_llm_calls": 3})
    claimed = Agent.claim_many([d.pk for d in dispatches])
    turn.refresh_from_db()
    assert len(claimed) == 4 and turn.agent_llm_calls == 0
    assert not any(agent.counted for agent in claimed.values())


def test_a_claim_of_several_keeps_what_a_claim_of_one_does(ready):
    turn, (fresh, taken, resumed, _) = ready
    lifecycle.transition(taken.pk, source=DispatchState.CREATED, target=DispatchState.RUNNING, lease_token="other")
    AgentDispatch.objects.filter(pk=resumed.pk).update(
        started_at=timezone.now(), deadline_at=timezone.now(), awaiting={"agent_ids": ["b1"]})

    claimed = Agent.claim_many([fresh.pk, taken.pk, resumed.pk])

    assert set(claimed) == {fresh.pk, resumed.pk}
    assert AgentDispatch.objects.get(pk=taken.pk).lease_token == "other"  # untouched
    resumed_event = Event.objects.get(dispatch=resumed, type="agent.subagent_attempt")
    assert resumed_event.payload["reason"] == "its agents finished"

    paused = turn_for(conversation_for(turn.conversation.owner), status=TurnStatus.PAUSED)
    other = dispatch_for(paused, "p1", queued_at=timezone.now())
    assert Agent.claim_many([other.pk, dispatch_for(turn, "a9").pk]).keys() == {
        AgentDispatch.objects.get(turn=turn, agent_id="a9").pk}
    other.refresh_from_db()
    assert other.state == DispatchState.CREATED and other.queued_at is None  # the schedule queues it on resume


def test_a_move_of_several_tells_which_it_moved(ready):
    _, (a, b, c, _) = ready
    lifecycle.transition(b.pk, source=DispatchState.CREATED, target=DispatchState.RUNNING, lease_token="first")
    moved = lifecycle.transition_each({pk: {"lease_token": f"t{pk}"} for pk in (a.pk, b.pk, c.pk)},
                                      source=DispatchState.CREATED, target=DispatchState.RUNNING)
    assert moved == {a.pk, c.pk}
    assert AgentDispatch.objects.get(pk=b.pk).lease_token == "first"
    with pytest.raises(ValueError, match="not in the lifecycle table"):
        lifecycle.transition_each({a.pk: {"lease_token": "x"}}, source=DispatchState.CLOSED,
                                  target=DispatchState.RUNNING)


def test_deliveries_begun_in_one_turn_of_the_loop_share_one_claim(monkeypatch):
    """What the runner does with a dispatch answer's agents (delivery/runner.py start_all)."""
    batches = []

    class Role:
        @classmethod
        def claim_many(cls, ids):
            batches.append(list(ids))
            return {pk: f"work {pk}" for pk in ids if pk != 2}

    async def inline(fn, /, *args, **kwargs):
        return fn(*args, **kwargs)

    monkeypatch.setattr(loop.runner, "db", inline)

    async def begin():
        together = await asyncio.gather(*(loop._claim(Role, pk) for pk in (1, 2, 3)))
        later = await loop._claim(Role, 4)
        return together, later

    together, later = asyncio.run(begin())
    assert together == ["work 1", None, "work 3"] and later == "work 4"
    assert batches == [[1, 2, 3], [4]]


@pytest.mark.parametrize("workers, woken, in_flight, ready, here", [
    (2, True, 1, 8, 4),  # a dispatch answer's eight agents: half here, half to the other process
    (3, True, 1, 8, 3),
    (2, True, 1, 1, 1),  # one dependent, or the orchestrator woken: here, without the queue
    (2, True, 8, 8, 8),  # a runner as busy as the wave: the other processes are busy too
    (1, True, 1, 8, 8),  # no other process
    (2, False, 1, 8, 8),  # a polled queue (SQLite): a queued agent would wait for the poll
])
def test_a_wave_larger_than_its_runners_work_is_shared_with_the_other_processes(
        monkeypatch, settings, workers, woken, in_flight, ready, here):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": workers}
    monkeypatch.setattr(queue.broker, "wakes_on_enqueue", lambda: woken)
    monkeypatch.setattr(queue.Conf, "SYNC", False)
    assert queue.share_here(in_flight, ready) == here
    monkeypatch.setattr(queue.Conf, "SYNC", True)  # tasks run inline: no other process
    assert queue.share_here(in_flight, ready) == ready


@pytest.mark.parametrize("workers, here, parts", [
    (2, [1, 2, 3, 4], [[5, 6, 7, 8]]),
    (3, [1, 2, 3], [[4, 5, 6], [7, 8]]),
])
def test_a_shared_waves_other_shares_are_queued_as_one_task_each(monkeypatch, settings, workers, here, parts):
    """Each part is begun together where it is taken (one claim), as the share here is."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": workers}
    monkeypatch.setattr(queue.broker, "wakes_on_enqueue", lambda: True)
    monkeypatch.setattr(queue.Conf, "SYNC", False)
    begun, queued = [], []

    class Runner:
        in_flight = 1  # the orchestrator's step that dispatched them

        def start_all(self, job, ids):
            begun.append(list(ids))
            return []

    monkeypatch.setattr(queue.runner, "current", Runner)
    monkeypatch.setitem(queue.JOBS, queue.AGENT, object())
    monkeypatch.setattr(queue, "async_task", lambda *args: queued.append(args))
    queue.deliver_all(queue.AGENT, [1, 2, 3, 4, 5, 6, 7, 8])
    assert begun == [here]
    assert queued == [(queue.PART_TASK, queue.AGENT, part) for part in parts]


def test_the_results_of_several_agents_are_merged_in_three_statements(ready):
    turn, (done, broke, other_done, _) = ready
    AgentDispatch.objects.filter(pk__in=[done.pk, other_done.pk]).update(state=DispatchState.WAITING_FOR_MERGE)
    AgentDispatch.objects.filter(pk=broke.pk).update(state=DispatchState.FAILED, outcome="timed out")
    read = list(turn.dispatches.filter(pk__in=[done.pk, broke.pk, other_done.pk]))  # as get_agent_results reads
    with CaptureQueriesContext(connection) as queries:
        lifecycle.dispatches_merge(read)
    assert len(statements(queries)) == 3, statements(queries)
    rows = {d.pk: d for d in AgentDispatch.objects.filter(pk__in=[done.pk, broke.pk, other_done.pk])}
    assert {d.state for d in rows.values()} == {DispatchState.CLOSED}
    assert [rows[pk].close_reason for pk in (done.pk, broke.pk, other_done.pk)] == ["merged", "timed out", "merged"]
    closed = {e.dispatch_id: e.payload["final_status"] for e in Event.objects.filter(type="agent.subagent_closed")}
    assert closed == {done.pk: "completed", broke.pk: "failed", other_done.pk: "completed"}


def test_a_merge_of_several_that_finds_one_moved_merges_each_as_it_stands(ready):
    _, (done, moved, _, _) = ready
    AgentDispatch.objects.filter(pk__in=[done.pk, moved.pk]).update(state=DispatchState.WAITING_FOR_MERGE)
    read = list(AgentDispatch.objects.filter(pk__in=[done.pk, moved.pk]))
    AgentDispatch.objects.filter(pk=moved.pk).update(state=DispatchState.CLOSED, close_reason="closed already")

    lifecycle.dispatches_merge(read)

    rows = {d.pk: d for d in AgentDispatch.objects.filter(pk__in=[done.pk, moved.pk])}
    assert (rows[done.pk].state, rows[done.pk].close_reason) == (DispatchState.CLOSED, "merged")
    assert rows[moved.pk].close_reason == "closed already"
    assert list(Event.objects.filter(type="agent.subagent_closed").values_list("dispatch_id", flat=True)) == [done.pk]


def test_agents_claimed_where_they_became_ready_are_taken_up_with_two_reads(ready):
    """A runner takes up agents claimed by the transaction that made them ready
    (lifecycle.agents_deliver) without writing: their rows and their owner's caps. One
    stopped in between, or claimed again by someone else, is left to whoever moved it."""
    turn, (a1, a2, stopped, _) = ready
    with transaction.atomic():
        started, counted = lifecycle.agents_start([a1, a2, stopped])
    assert [d.pk for d in started] == [a1.pk, a2.pk, stopped.pk] and counted
    claims = [queue.Claimed(d.pk, d.lease_token, counted) for d in started]
    lifecycle.transition(stopped.pk, source=DispatchState.RUNNING, target=DispatchState.CANCELLED)
    AgentDispatch.objects.filter(pk=a2.pk).update(lease_token="someone else's")

    with CaptureQueriesContext(connection) as queries:
        adopted = Agent.adopt_many(claims)
    assert len(statements(queries)) == 2, statements(queries)
    assert set(adopted) == {a1.pk}
    agent = adopted[a1.pk]
    assert agent.token == claims[0].token and agent.counted and agent.dispatch.state == DispatchState.RUNNING
    assert Event.objects.filter(turn=turn, type="agent.subagent_started").count() == 3
