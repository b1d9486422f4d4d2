"""What only a real database server shows: a query cut short by the deadline, and two
workers racing on one (dispatch, tool_call_id)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from orchestration.models import SkillExecution
from skills.base import Skill
from skills.executor import execute_skill
from skills.models import Task

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
