"""What only a real database server shows: a query cut short by the deadline, two
workers racing on one (dispatch, tool_call_id), and two agents' skills running at once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from orchestration.budgets.budget import reserve_skill_call
from orchestration.models import Event, SkillExecution
from skills.base import Skill
from skills.executor import execute_skill
from skills.models import Task
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.postgres

NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}


def test_a_slow_query_is_cancelled_at_the_deadline(call, register):
    def handler(user):
        Task.objects.create(owner=user, title="before the slow query")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")
        return {}

    register(
        Skill(
            name="testing.slow_query",
            description="Sleeps in the database.",
            parameters=NO_PARAMS,
            handler=handler,
            timeout=0.2,
        )
    )
    started = time.monotonic()
    outcome = call("testing.slow_query", {})
    assert time.monotonic() - started < 2  # cancelled on the server, not waited for
    assert outcome.status == "timeout"
    assert not Task.objects.exists()
    assert SkillExecution.objects.get().status == "timeout"  # the connection still works


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_on_one_call_run_it_once(register, dispatch, alice):
    runs = []

    def handler(user):
        runs.append(threading.current_thread().name)
        Task.objects.create(owner=user, title="once")
        time.sleep(0.5)  # the other worker's insert waits on the unique key meanwhile
        return {"done": True}

    register(
        Skill(
            name="testing.once",
            description="Slow side effect.",
            parameters=NO_PARAMS,
            handler=handler,
        )
    )
    start = threading.Barrier(2)
    outcomes = []

    def worker():
        try:
            start.wait()
            outcomes.append(
                execute_skill(
                    name="testing.once",
                    arguments={},
                    user=alice,
                    tool_call_id="call_1",
                    scope={"dispatch": dispatch},
                )
            )
        finally:
            connections.close_all()

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert len(runs) == 1 and Task.objects.count() == 1
    assert sorted(outcome.replayed for outcome in outcomes) == [False, True]
    assert outcomes[0].execution_id == outcomes[1].execution_id
    assert all(outcome.data == {"done": True} for outcome in outcomes)


@pytest.mark.django_db(transaction=True)
def test_parallel_agents_skills_run_at_the_same_time(register, dispatch, alice):
    """The turn's and the conversation's budget rows are locked only while a call is
    reserved, not while its handler runs: otherwise one agent's slow skill holds every
    other agent of the conversation at its next skill call (and its next LLM result)."""
    second_started = threading.Event()
    met = []

    def handler(user, role):
        if role == "first":
            met.append(second_started.wait(timeout=10))  # the second runs while this one does
        else:
            second_started.set()
        return {"role": role}

    register(
        Skill(
            name="testing.rendezvous",
            description="Waits for a sibling agent's call.",
            parameters={"type": "object", "properties": {"role": {"type": "string"}}, "required": ["role"],
                        "additionalProperties": False},
            handler=handler,
        )
    )
    sibling = dispatch_for(dispatch.turn, agent_id="a2")
    outcomes = {}

    def agent(agent_dispatch, role):
        try:
            outcomes[role] = execute_skill(
                name="testing.rendezvous", arguments={"role": role}, user=alice, tool_call_id="call_1",
                scope={"dispatch": agent_dispatch},
                before_run=lambda *_: reserve_skill_call(dispatch=agent_dispatch, skill="testing.rendezvous",
                                                      arguments={"role": role}),
            )
        finally:
            connections.close_all()

    first = threading.Thread(target=agent, args=(dispatch, "first"))
    first.start()
    while not SkillExecution.objects.filter(dispatch=dispatch).exists():  # the first is in its handler
        time.sleep(0.01)
    agent(sibling, "second")
    first.join()
    assert met == [True]
    assert all(outcome.ok for outcome in outcomes.values())
    dispatch.turn.refresh_from_db()
    assert dispatch.turn.skill_calls == 2
    assert Event.objects.filter(type="skill.started").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_last_skill_call_of_a_turn_goes_to_one_of_two_racing_agents(alice):
    """The second agent's reservation waits on the first one's row lock; once that commits,
    the turn's count must be read again, so the second is refused, not counted past the limit."""
    from orchestration.budgets.limits import Limits, LimitTripped

    limits = {**Limits.from_settings().to_json(), "turn_max_skill_calls": 1}
    turn = turn_for(conversation_for(alice), limits=limits)
    first, second = (dispatch_for(turn, agent_id, state="running", lease_token=f"token-{agent_id}")
                     for agent_id in ("a1", "a2"))
    first_reserved, second_done = threading.Event(), threading.Event()
    outcome = []

    def reserve_second():
        try:
            first_reserved.wait()
            reserve_skill_call(dispatch=second, skill="tasks.search", arguments={}, token="token-a2")
            outcome.append("taken")
        except LimitTripped as tripped:
            outcome.append(tripped.limit)
        finally:
            second_done.set()
            connections.close_all()

    racer = threading.Thread(target=reserve_second)
    racer.start()
    with transaction.atomic():
        reserve_skill_call(dispatch=first, skill="tasks.search", arguments={}, token="token-a1")
        first_reserved.set()
        assert not second_done.wait(0.5)  # waiting on this transaction's row lock
    racer.join(10)

    assert outcome == ["turn_max_skill_calls"]
    turn.refresh_from_db()
    assert turn.skill_calls == 1
