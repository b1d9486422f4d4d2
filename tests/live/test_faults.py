"""Faults against a real qcluster: killed workers and clusters, a restarted database, a
flushed Redis, and an LLM that hangs, throttles, errors or answers badly.

Every scenario ends with the same checks (`assert_settled`): the turn completed or
failed with an error the user can read, no dispatch is left `running`, no email went
out twice, and the timeline a fresh page renders is exactly the Event table.

(The SIGKILL of a worker in the middle of an LLM call is in test_qcluster.py.)
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ
from django_q.tasks import async_task

from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, Event, Message, SkillExecution, Turn
from orchestration.lifecycle.reaper import reap_expired
from orchestration.lifecycle.turns import turn_start
from orchestration.reports.errors import failure_of
from skills.domains.email.models import OutboxEmail
from tests.checks import assert_ended_turns_closed
from tests.factories import conversation_for
from tests.live.conftest import LEASE_SECONDS, wait_for
from tests.live.test_qcluster import EMAIL, SEARCH, is_agent, turn_done
from tests.support.llm_server import Agent, Plan, Reply, http_error

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EVENT_ROW = re.compile(r'id="event-(\d+)"')


@pytest.fixture
def mail(tmp_path) -> Path:
    """The mail directory of a cluster started with `mail_env(mail)`."""
    directory = tmp_path / "mail" / "sent"
    directory.mkdir(parents=True)
    return directory


def mail_env(directory: Path) -> dict[str, str]:
    return {"EMAIL_BACKEND": "tests.live.mail.HeldFileBackend", "EMAIL_FILE_PATH": str(directory)}


def page_event_ids(conversation_id: int, owner) -> list[int]:
    """The event rows a freshly loaded conversation page shows, in page order."""
    client = Client()
    client.force_login(owner)
    response = client.get(reverse("conversation_detail", args=[conversation_id]))
    assert response.status_code == 200
    return [int(i) for i in EVENT_ROW.findall(response.content.decode())]


def assert_settled(turn: Turn, mail_dir: Path | None = None) -> None:
    turn.refresh_from_db()
    assert turn.status in ("completed", "failed"), (turn.status, turn.error)
    if turn.status == "failed":
        notices = Message.objects.filter(turn=turn, role=Message.Role.NOTICE).values_list("content", flat=True)
        # the error in words in the chat (its technical text stays in the turn and the audit)
        words = failure_of(turn.error).words
        assert turn.error and any(words in notice for notice in notices), (turn.error, list(notices))
    running = list(AgentDispatch.objects.filter(turn=turn, state=DispatchState.RUNNING).values_list("agent_id", flat=True))
    assert running == [], f"dispatches left running: {running}"
    assert_ended_turns_closed()
    sent = SkillExecution.objects.filter(dispatch__turn=turn, skill="email.send", status="completed").count()
    assert OutboxEmail.objects.count() == sent
    if mail_dir is not None:
        assert len(list(mail_dir.iterdir())) == sent, "an email went out twice, or went out and was not recorded"
    stored = list(Event.objects.filter(conversation=turn.conversation).order_by("id").values_list("id", flat=True))
    shown = page_event_ids(turn.conversation_id, turn.conversation.owner)
    assert sorted(shown) == stored, {"missing": sorted(set(stored) - set(shown)), "doubled": len(shown) - len(set(shown))}


def wait_turn_reaping(turn: Turn, cluster, *, timeout: float = 90) -> None:
    """Wait for the turn to finish, running the reaper as its schedule would (every lease)."""
    last_reap = time.monotonic()

    def finished() -> bool:
        nonlocal last_reap
        if time.monotonic() - last_reap > LEASE_SECONDS:
            reap_expired()
            last_reap = time.monotonic()
        return turn_done(turn)

    wait_for(finished, timeout=timeout, what=f"turn {turn.pk} to finish", cluster=cluster)


def test_sigkill_worker_mid_skill_sends_the_email_once(llm, qcluster, alice, mail):
    plan = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed Bob."),
                 Agent("reader", ["tasks.search"], [SEARCH])], answer="Mail sent.")
    llm.latency = 0.05
    llm.respond = plan
    hold, holding = mail.parent / "hold", mail.parent / "holding"
    hold.touch()
    cluster = qcluster(workers=3, env=mail_env(mail))
    turn = turn_start(conversation=conversation_for(alice), text="Mail Bob")

    wait_for(holding.exists, timeout=60, what="email.send to start", cluster=cluster)
    worker = int(holding.read_text())
    assert worker in cluster.descendants()
    os.kill(worker, signal.SIGKILL)
    hold.unlink()

    mailer = AgentDispatch.objects.get(turn=turn, agent_id="mailer")
    assert mailer.state == "running"
    # The handler's transaction died with the worker: nothing of the half-done send
    # remains. Its execution row stays open (running), with the call's reservation.
    assert OutboxEmail.objects.count() == 0
    assert list(SkillExecution.objects.filter(dispatch=mailer).values_list("status", flat=True)) == ["running"]
    assert list(mail.iterdir()) == []

    wait_turn_reaping(turn, cluster)

    assert_settled(turn, mail)
    assert turn.status == "completed", turn.error
    mailer.refresh_from_db()
    assert (mailer.outcome, mailer.crashes) == ("completed", 1)
    assert OutboxEmail.objects.count() == 1
    assert turn.skill_calls == 2  # the replayed send did not reserve a second call
    assert llm.errors == []


def test_sigkill_worker_after_the_email_went_out_sends_it_once(llm, qcluster, alice, mail, tmp_path):
    """The worker dies after the mail went out, before its call committed. The replay
    finds the journal entry the send left (skills/journal.py): it records the mail in the
    outbox and does not send it again."""
    plan = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed Bob."),
                 Agent("reader", ["tasks.search"], [SEARCH])], answer="Mail sent.")
    llm.latency = 0.05
    llm.respond = plan
    hold_after, holding = mail.parent / "hold-after", mail.parent / "holding"
    journal = tmp_path / "journal"  # the cluster's SKILLS_JOURNAL_ROOT
    hold_after.touch()
    cluster = qcluster(workers=3, env=mail_env(mail))
    turn = turn_start(conversation=conversation_for(alice), text="Mail Bob")

    wait_for(holding.exists, timeout=60, what="email.send to deliver", cluster=cluster)
    worker = int(holding.read_text())
    assert worker in cluster.descendants()
    os.kill(worker, signal.SIGKILL)
    hold_after.unlink()

    mailer = AgentDispatch.objects.get(turn=turn, agent_id="mailer")
    assert mailer.state == "running"
    # The mail went out; the outbox row died with the call's transaction, the execution
    # row stays open (running), and the journal holds what the send did.
    (sent,) = mail.iterdir()
    assert OutboxEmail.objects.count() == 0
    assert list(SkillExecution.objects.filter(dispatch=mailer).values_list("status", flat=True)) == ["running"]
    assert len(list(journal.iterdir())) == 1

    wait_turn_reaping(turn, cluster)

    assert_settled(turn, mail)
    assert turn.status == "completed", turn.error
    mailer.refresh_from_db()
    assert (mailer.outcome, mailer.crashes) == ("completed", 1)
    assert list(mail.iterdir()) == [sent]
    email = OutboxEmail.objects.get()
    assert f"Message-ID: {email.message_id}" in sent.read_text()
    assert turn.skill_calls == 2  # the replayed send did not reserve a second call
    assert list(journal.iterdir()) == []  # removed once the replay committed
    assert llm.errors == []


def test_sigkill_whole_cluster_with_work_queued_then_restart(llm, qcluster, alice):
    """Tasks the dead cluster had taken from the queue, but not started, are not lost."""
    agents = [Agent(f"w{i}", ["tasks.search"], [SEARCH]) for i in range(6)]
    llm.latency = 0.4
    llm.respond = Plan(agents, answer="Six searches done.")
    # Runners with room for 2 jobs each: of the 6 agents, some wait in the queue.
    cluster = qcluster(workers=2, env={"ASSISTANT_AGENTS_IN_FLIGHT": "4"})
    turn = turn_start(conversation=conversation_for(alice), text="Six searches on two workers")

    def midway() -> bool:
        states = list(AgentDispatch.objects.filter(turn=turn).values_list("state", flat=True))
        return len(states) == 6 and states.count("running") >= 1 and states.count("created") >= 2

    wait_for(midway, timeout=60, what="agents running with more queued", cluster=cluster)
    os.killpg(cluster.pid, signal.SIGKILL)
    cluster.stop()
    queued = AgentDispatch.objects.filter(turn=turn, state="created").count()
    assert queued >= 2

    restarted = qcluster(workers=2)
    wait_turn_reaping(turn, restarted)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    dispatches = AgentDispatch.objects.filter(turn=turn)
    assert {(d.state, d.outcome) for d in dispatches} == {("closed", "completed")}
    # Each agent's one search ran once, however many times its task was delivered.
    assert SkillExecution.objects.filter(dispatch__turn=turn).count() == 6
    assert llm.errors == []


def test_sigkill_cluster_holding_every_queued_task_then_restart(llm, qcluster, alice):
    """The dead cluster had taken the agents' tasks from the queue (django-q2 hands such
    tasks out again only after Q_CLUSTER["retry"], 11 minutes) and no agent had started,
    so no finishing agent would re-queue the others: the reaper must."""
    agents = [Agent(f"q{i}", ["tasks.search"], [SEARCH]) for i in range(2)]
    llm.latency = 0.2
    llm.respond = Plan(agents, answer="Both searches done.")
    # One worker whose runner holds one job: the orchestrator's step fills it, so the
    # agents it dispatches go to the queue rather than starting on the runner.
    cluster = qcluster(workers=1, env={"ASSISTANT_AGENTS_IN_FLIGHT": "1"})
    turn = turn_start(conversation=conversation_for(alice), text="Two searches, one busy worker")
    async_task("time.sleep", 60)  # someone else's long task: holds the worker's process

    def taken() -> bool:  # the turn waits; the pusher has locked the agents' tasks
        turn.refresh_from_db()
        return (turn.status == "waiting" and AgentDispatch.objects.filter(turn=turn, state="created").count() == 2
                and OrmQ.objects.filter(lock__gt=timezone.now()).count() == 3)

    wait_for(taken, timeout=60, what="the cluster to take both agents' tasks", cluster=cluster)
    os.killpg(cluster.pid, signal.SIGKILL)
    cluster.stop()

    restarted = qcluster(workers=2)
    wait_turn_reaping(turn, restarted, timeout=60)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert SkillExecution.objects.filter(dispatch__turn=turn).count() == 2
    assert llm.errors == []


def test_sigterm_during_a_turn_then_restart(llm, qcluster, alice):
    agents = [Agent(f"t{i}", ["tasks.search"], [SEARCH]) for i in range(4)]
    llm.latency = 1.0
    llm.respond = Plan(agents, answer="Four searches done.")
    cluster = qcluster(workers=2)
    turn = turn_start(conversation=conversation_for(alice), text="Four searches, then a SIGTERM")

    wait_for(lambda: AgentDispatch.objects.filter(turn=turn, state="running").exists(), timeout=60,
             what="an agent to be running", cluster=cluster)
    cluster.process.send_signal(signal.SIGTERM)
    cluster.process.wait(timeout=60)  # graceful: the workers finish the tasks they hold
    cluster.stop()

    restarted = qcluster(workers=2)
    wait_turn_reaping(turn, restarted)

    assert_settled(turn)
    assert turn.status == "completed", turn.error
    assert SkillExecution.objects.filter(dispatch__turn=turn).count() == 4
    assert llm.errors == []


def _restart_postgres() -> None:
    versions = os.listdir("/etc/postgresql")
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", versions[0], "main", "restart"],
                   check=True, capture_output=True, timeout=60)


@pytest.mark.serial  # the other test processes' connections die with the server
@pytest.mark.skipif(settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
                    reason="restarts the PostgreSQL server")
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/etc/postgresql"),
                    reason="needs root and a Debian PostgreSQL cluster to restart")
def test_postgres_restart_mid_turn(llm, qcluster, alice, mail, settings):
    """The server restarts while two of four agents are running. Every step retries
    transient database errors on a fresh connection (for ASSISTANT_DB_RETRY_SECONDS), so
    every agent ends as it would have without the restart: completed, none failed with
    OperationalError. The lease is longer than the test's bound, so this is the engine's
    own retry, not the reaper handing out work whose lease expired."""
    lease = 60
    settings.ASSISTANT_LEASE_SECONDS = lease  # the reaper this test runs reads it too
    settings.ASSISTANT_DB_RETRY_SECONDS = 30
    agents = [Agent("mailer", ["email.send"], [EMAIL]),
              *[Agent(f"p{i}", ["tasks.search"], [SEARCH]) for i in range(3)]]
    llm.latency = 1.5
    llm.respond = Plan(agents, answer="Done despite the restart.")
    cluster = qcluster(workers=4, env={**mail_env(mail), "ASSISTANT_LEASE_SECONDS": str(lease),
                                       "ASSISTANT_DB_RETRY_SECONDS": "30"})
    turn = turn_start(conversation=conversation_for(alice), text="Work through a database restart")

    wait_for(lambda: AgentDispatch.objects.filter(turn=turn, state="running").count() >= 2, timeout=60,
             what="agents to be running", cluster=cluster)
    _restart_postgres()
    connection.close()  # this process's connection died with the server too

    def answering() -> bool:
        try:
            turn.refresh_from_db()
        except OperationalError:
            connection.close()
            return False
        return True

    wait_for(answering, timeout=30, what="the database to answer again", cluster=cluster)
    # Bounded well inside the lease: no expired lease can be what recovers the work. The
    # reaper runs as its schedule would meanwhile (it may wake a waiting turn).
    deadline, last_reap = time.monotonic() + lease - 15, time.monotonic()
    while not turn_done(turn) and time.monotonic() < deadline:
        if time.monotonic() - last_reap > LEASE_SECONDS:
            reap_expired()
            last_reap = time.monotonic()
        time.sleep(0.2)

    # Every agent ended as it would have without the restart ...
    outcomes = {d.agent_id: (d.state, d.outcome, d.error[:120])
                for d in AgentDispatch.objects.filter(turn=turn).order_by("agent_id")}
    assert sorted(outcomes) == ["mailer", "p0", "p1", "p2"]
    failed = {agent: error for agent, (_, _, error) in outcomes.items() if "OperationalError" in error}
    assert failed == {}, f"agents failed on the restart: {failed}; turn {turn.status}; all: {outcomes}"
    assert all(state in (DispatchState.COMPLETED, DispatchState.CLOSED) and outcome == DispatchOutcome.COMPLETED
               for state, outcome, _ in outcomes.values()), outcomes
    # ... and the turn answered, within the bound.
    assert turn.status == "completed", (turn.status, turn.error, outcomes, cluster.log_tail())
    assert_settled(turn, mail)
    assert not Event.objects.filter(turn=turn, type="agent.subagent_failed").exists()
    assert SkillExecution.objects.filter(dispatch__turn=turn, status="completed").count() == 4
    assert llm.errors == []


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs the Redis channel layer")
def test_redis_flush_mid_turn_loses_no_event_on_the_socket(llm, qcluster, alice):
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from redis import Redis

    from assistant.routing import websocket_urlpatterns

    agents = [Agent(f"r{i}", ["tasks.search"], [SEARCH, SEARCH]) for i in range(3)]
    llm.latency = 0.5
    llm.respond = Plan(agents, answer="Searched through a Redis flush.")
    conversation = conversation_for(alice)
    received: list[int] = []
    stop = threading.Event()
    connected = threading.Event()

    async def listen():
        comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/conversations/{conversation.pk}/?last=0")
        comm.scope["user"] = alice
        assert (await comm.connect())[0]
        connected.set()
        while not stop.is_set():
            # (receive_from's timeout would cancel the consumer: asgiref's communicator)
            if await comm.receive_nothing(timeout=0.5):
                continue
            received.extend(int(i) for i in EVENT_ROW.findall(await comm.receive_from()))
        await comm.disconnect()

    listener = threading.Thread(target=asyncio.run, args=(listen(),), daemon=True)
    listener.start()
    assert connected.wait(10)
    cluster = qcluster(workers=4)
    turn = turn_start(conversation=conversation, text="Search while Redis is flushed")

    wait_for(lambda: Event.objects.filter(turn=turn, type="skill.finished").exists(), timeout=60,
             what="a first skill call", cluster=cluster)
    Redis.from_url(settings.REDIS_URL).flushdb()
    wait_turn_reaping(turn, cluster)

    stored = list(Event.objects.filter(conversation=conversation).order_by("id").values_list("id", flat=True))
    # The socket's periodic catch-up from the Event table repairs what the flush lost.
    wait_for(lambda: set(received) >= set(stored), timeout=20, what="the socket to catch up", cluster=cluster)
    stop.set()
    listener.join(10)
    assert len(received) == len(set(received)), "an event was sent twice"
    assert sorted(received) == stored
    assert_settled(turn)
    assert turn.status == "completed", turn.error


# --- the LLM misbehaving ------------------------------------------------------------------


def _hang(reply: Reply) -> Reply:
    reply.delay = 30  # longer than the client's timeout
    return reply


def _garbled(reply: Reply) -> Reply:
    if reply.tool_calls:
        cid, name, _ = reply.tool_calls[0]
        reply.tool_calls = [(cid, name, '{"skill": "email.send", "arguments": {"to": [')]
    return reply


def _truncated(reply: Reply) -> Reply:
    return Reply(content="I will now send the ema", finish_reason="length")


LLM_FAULTS = {
    # name: (whose calls, how many of them, what happens to the reply, environment, expected turn status)
    "agent hangs every time": ("mailer", None, _hang, {}, "completed"),
    "agent throttled once (429)": ("mailer", 1, lambda r: http_error(429, "slow down", {"retry-after": "0.2"}),
                                   {"ASSISTANT_LLM_MAX_RETRIES": "2"}, "completed"),
    "agent gets 500 every time": ("mailer", None, lambda r: http_error(500, "boom"), {}, "completed"),
    "agent's tool call is malformed JSON": ("mailer", 1, _garbled, {}, "completed"),
    "agent's answer is truncated": ("mailer", None, _truncated, {}, "completed"),
    "orchestrator hangs": ("orchestrator", None, _hang, {}, "failed"),
    "orchestrator gets 500 every time": ("orchestrator", None, lambda r: http_error(500, "boom"), {}, "failed"),
}


@pytest.mark.parametrize("fault", list(LLM_FAULTS))
def test_llm_faults_end_cleanly(llm, qcluster, alice, mail, fault):
    whose, times, spoil, env, expected = LLM_FAULTS[fault]
    plan = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed Bob."),
                 Agent("reader", ["tasks.search"], [SEARCH])], answer="Done.")
    spoiled = 0
    lock = threading.Lock()

    def respond(request):
        nonlocal spoiled
        reply = plan(request)
        names = {tool["function"]["name"] for tool in request.get("tools", [])}
        target = is_agent(request, whose) if whose != "orchestrator" else "use_skill" not in names
        with lock:
            if target and (times is None or spoiled < times):
                spoiled += 1
                return spoil(reply)
        return reply

    llm.respond = respond
    cluster = qcluster(workers=3, env={**mail_env(mail), "ASSISTANT_LLM_TIMEOUT_SECONDS": "2", **env})
    turn = turn_start(conversation=conversation_for(alice), text=f"Mail Bob ({fault})")
    wait_turn_reaping(turn, cluster, timeout=120)

    assert_settled(turn, mail)
    assert turn.status == expected, turn.error
    assert spoiled >= 1
    if expected == "completed":
        mailer = AgentDispatch.objects.get(turn=turn, agent_id="mailer")
        assert mailer.outcome in ("completed", "failed")
        if mailer.outcome == "failed":
            assert mailer.error, "a failed agent says why"
        reader = AgentDispatch.objects.get(turn=turn, agent_id="reader")
        assert reader.outcome == "completed"
