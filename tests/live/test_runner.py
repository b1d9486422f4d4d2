"""The execution model at scale (DESIGN.md §4, "Waiting is not work"), on real qclusters.

A worker process hosts a runner: its agents wait on the model as coroutines, not as
processes. So one default qcluster has a hundred agents in flight at once, with a
bounded number of database connections; and whatever ends a worker process — the
cluster's SIGTERM, django-q2 recycling it, its task timeout — no agent in flight is
lost or run twice. Two qclusters share one turn's agents.
"""

from __future__ import annotations

import signal
import threading

import pytest
from django.conf import settings
from django.db import connection

from orchestration.models import AgentDispatch, LLMCall, SkillExecution
from orchestration.lifecycle.turns import turn_start
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.test_faults import assert_settled, wait_turn_reaping
from tests.live.test_qcluster import SEARCH, turn_done
from tests.support.llm_server import Agent, Plan, Reply, agent_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


# A lease must outlast a step (the system check says so for real settings); the live
# tests' 5 s lease would hand a 4–5 s model call to the reaper on a loaded machine.
OUTLASTS_A_SLOW_CALL = {"ASSISTANT_LEASE_SECONDS": "30"}


def slow_agents(plan: Plan, seconds: float):
    """`plan`, with every agent's model calls taking `seconds`."""

    def respond(request: dict) -> Reply:
        reply = plan(request)
        if "use_skill" in {t["function"]["name"] for t in request.get("tools", [])}:
            reply.delay = seconds
        return reply

    return respond


def database_clock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def connections_to_this_database(since) -> int:
    """Connections opened since `since`: the cluster's, not ones this test process kept
    from earlier tests in it (the socket tests' thread pools, say)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND backend_start >= %s", [since])
        return cursor.fetchone()[0]


def test_a_hundred_agents_in_flight_on_one_default_qcluster(llm, qcluster, alice):
    """13 turns of 8 agents, every agent's model call taking 4 s, on the default cluster
    (Q_WORKERS, ASSISTANT_AGENTS_IN_FLIGHT): their calls overlap, 100 and more at once."""
    agents = [Agent(f"a{i}", ["tasks.search"], [SEARCH]) for i in range(8)]
    llm.respond = slow_agents(Plan(agents, answer="Eight searches done.", discover=False), 4.0)
    since = database_clock() if connection.vendor == "postgresql" else None
    cluster = qcluster(workers=settings.Q_WORKERS, env=OUTLASTS_A_SLOW_CALL)
    turns = [turn_start(conversation=conversation_for(alice), text=f"Eight searches, {n}") for n in range(13)]

    wait_for(lambda: llm.peak_in_flight >= 100, timeout=30, what="100 model calls in flight", cluster=cluster)
    connections = connections_to_this_database(since) if since is not None else None
    for turn in turns:
        wait_turn_reaping(turn, cluster, timeout=120)

    assert llm.peak_in_flight >= 100
    for turn in turns:
        assert_settled(turn)
        assert turn.status == "completed", turn.error
    assert AgentDispatch.objects.filter(outcome="completed").count() == 104
    assert SkillExecution.objects.count() == 104
    if connections is not None:
        # Per worker: its runner's database threads and its main thread (measured: 9
        # each); then the sentinel, monitor, pusher and its LISTEN connection, and a
        # recycled worker's connections the server has not dropped yet: a handful,
        # however many agents are in flight.
        bound = settings.Q_WORKERS * (settings.ASSISTANT_RUNNER_DB_THREADS + 1) + 10
        assert connections <= bound, (connections, bound)
        print(f"\nconnections the cluster opened: {connections} (bound {bound}) for {llm.peak_in_flight} calls in flight")
    assert llm.errors == []


def test_sigterm_hands_back_the_agents_in_flight(llm, qcluster, alice):
    """SIGTERM, with no time to let agents finish (ASSISTANT_RUNNER_DRAIN_SECONDS=0): the
    cluster stops taking work, every agent in flight finishes its model call, stores it
    and goes back to the queue; a new cluster finishes them from there (their stored
    steps replayed: no model call, no skill twice)."""
    agents = [Agent(f"t{i}", ["tasks.search"], [SEARCH, SEARCH]) for i in range(6)]
    llm.respond = slow_agents(Plan(agents, answer="Six searches done."), 1.5)
    cluster = qcluster(workers=2, env={"ASSISTANT_RUNNER_DRAIN_SECONDS": "0"})
    turn = turn_start(conversation=conversation_for(alice), text="Six searches, then a SIGTERM")

    wait_for(lambda: AgentDispatch.objects.filter(turn=turn, state="running").count() == 6, timeout=30,
             what="every agent in flight", cluster=cluster)
    cluster.process.send_signal(signal.SIGTERM)
    cluster.process.wait(timeout=30)
    assert "still in flight at exit" not in cluster.log()
    states = dict(AgentDispatch.objects.filter(turn=turn).values_list("agent_id", "state"))
    assert "running" not in states.values(), states  # handed back, not left to the reaper
    cluster.stop()

    restarted = qcluster(workers=2)
    wait_for(lambda: turn_done(turn), timeout=60, what="the turn to finish", cluster=restarted)
    assert_settled(turn)
    assert turn.status == "completed", turn.error
    for dispatch in AgentDispatch.objects.filter(turn=turn):
        assert SkillExecution.objects.filter(dispatch=dispatch).count() == 2
        assert LLMCall.objects.filter(dispatch=dispatch).count() == dispatch.llm_calls == 3
    asked = [r for r in llm.requests if "use_skill" in {t["function"]["name"] for t in r.get("tools", [])}]
    assert len(asked) == 6 * 3  # no model call asked twice
    assert llm.errors == []


def test_recycled_workers_lose_no_agent(llm, qcluster, alice):
    """django-q2 replaces a worker process after Q_RECYCLE tasks; here after each one,
    while its runner has agents in flight: they finish there (or are handed on), never
    lost or doubled."""
    agents = [Agent(f"r{i}", ["tasks.search"], [SEARCH, SEARCH]) for i in range(6)]
    llm.respond = slow_agents(Plan(agents, answer="Done across recycled workers."), 0.5)
    cluster = qcluster(workers=2, env={"Q_RECYCLE": "1", "ASSISTANT_AGENTS_IN_FLIGHT": "4"})
    turn = turn_start(conversation=conversation_for(alice), text="Recycle as you go")
    wait_turn_reaping(turn, cluster)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert SkillExecution.objects.filter(dispatch__turn=turn).count() == 12
    assert "stopped doing work" in cluster.log()  # workers were indeed recycled
    assert llm.errors == []


def test_the_task_timeout_cannot_kill_agents_in_flight(llm, qcluster, alice):
    """An agent's model call outlasts django-q2's task timeout: its task returned long
    before, so the sentinel has nothing to kill."""
    agents = [Agent(f"s{i}", ["tasks.search"], [SEARCH]) for i in range(3)]
    llm.respond = slow_agents(Plan(agents, answer="Slow but done."), 5.0)
    cluster = qcluster(workers=2, env={"Q_TIMEOUT": "2", **OUTLASTS_A_SLOW_CALL})
    turn = turn_start(conversation=conversation_for(alice), text="Slow model")
    wait_turn_reaping(turn, cluster, timeout=60)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert "reincarnated worker" not in cluster.log()
    assert {d.crashes for d in AgentDispatch.objects.filter(turn=turn)} == {0}
    assert llm.errors == []


def test_two_qclusters_share_one_turns_agents(llm, qcluster, alice):
    """Each cluster's runner holds 2 jobs: the turn's 6 agents overflow to the queue and
    both clusters run some; every agent runs once."""
    ran_by: dict[str, set[int]] = {}
    lock = threading.Lock()
    plan = Plan([Agent(f"w{i}", ["tasks.search"], [SEARCH]) for i in range(6)], answer="Shared.")
    clusters = []

    def respond(request: dict) -> Reply:
        if "use_skill" in {t["function"]["name"] for t in request.get("tools", [])}:
            pid = next(c.pid_of_connection(llm.client[1], port) for c in clusters
                       if c.pid_of_connection(llm.client[1], port))
            owner = next(c.pid for c in clusters if pid in c.descendants())
            agent_id = request["messages"][1]["content"].split("mission:", 1)[1].split()[0]
            with lock:
                ran_by.setdefault(agent_id, set()).add(owner)
        return plan(request)

    port = int(llm.url.rsplit(":", 1)[1].split("/")[0])
    llm.respond = respond
    llm.latency = 0.5
    env = {"ASSISTANT_AGENTS_IN_FLIGHT": "2"}
    clusters.extend([qcluster(workers=1, env=env), qcluster(workers=1, env=env)])
    turn = turn_start(conversation=conversation_for(alice), text="Six agents, two clusters")
    wait_turn_reaping(turn, clusters[0], timeout=90)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert sorted(ran_by) == [f"w{i}" for i in range(6)]
    assert all(len(owners) == 1 for owners in ran_by.values()), ran_by  # no agent on both
    assert len(set().union(*ran_by.values())) == 2, ran_by  # both clusters took some
    assert SkillExecution.objects.filter(dispatch__turn=turn).count() == 6
    assert {d.crashes for d in AgentDispatch.objects.filter(turn=turn)} == {0}
    assert llm.errors == []


def test_a_wave_of_agents_spreads_over_the_clusters_worker_processes(llm, qcluster, alice, settings):
    """Twelve agents dispatched at once, on a cluster of two worker processes. On
    PostgreSQL the runner that dispatched them begins its half and queues the rest, which
    the other, idle process takes: the agents' steps run on both cores. On SQLite the
    queue is polled, not woken: all begin at once on the dispatching runner."""
    ran_on: dict[str, set[int]] = {}
    lock = threading.Lock()
    plan = Plan([Agent(f"w{i}", ["tasks.search"], [SEARCH]) for i in range(12)], answer="Spread.", discover=False)
    cluster = None

    def respond(request: dict) -> Reply:
        if "use_skill" in {t["function"]["name"] for t in request.get("tools", [])}:
            pid = cluster.pid_of_connection(llm.client[1], port)
            with lock:
                ran_on.setdefault(agent_of(request), set()).add(pid)
        return plan(request)

    port = int(llm.url.rsplit(":", 1)[1].split("/")[0])
    llm.respond, llm.latency = respond, 0.2
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_agents": 12}
    cluster = qcluster(workers=2, env={"LIMIT_TURN_MAX_AGENTS": "12"})
    turn = turn_start(conversation=conversation_for(alice), text="Twelve agents at once")
    wait_turn_reaping(turn, cluster, timeout=60)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert sorted(ran_on) == sorted(f"w{i}" for i in range(12))
    assert all(len(pids) == 1 and None not in pids for pids in ran_on.values()), ran_on  # each on one process
    processes = set().union(*ran_on.values())
    assert len(processes) == (2 if connection.vendor == "postgresql" else 1), ran_on
    assert {d.crashes for d in AgentDispatch.objects.filter(turn=turn)} == {0}
    assert llm.errors == []
