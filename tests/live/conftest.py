"""A real `manage.py qcluster` subprocess against the test database (no inline tasks).

The cluster sees only committed data, so these tests use `transactional_db`. On SQLite
the test database is a file (assistant/databases.py gives it one per test process); on
PostgreSQL the subprocess connects to the test database by name.

Process tree: `qcluster` (its own session and process group) → the Sentinel → workers,
monitor and pusher. Teardown sends SIGTERM, then SIGKILLs the whole group, so nothing
is left behind. Tests that need to kill one worker find it by the TCP connection it is
using to talk to the scripted LLM server (see `LiveLLM` and `Cluster.pid_of_connection`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django_q.conf import Conf
from django_q.models import Schedule

from tests.support import processes
from tests.support.llm_server import ScriptedLLM
from tests.support.processes import STARTUP_SECONDS, database_url  # noqa: F401 - re-exported

LEASE_SECONDS = 5


class LiveLLM(ScriptedLLM):
    """The scripted server, which also tells `respond` who is asking.

    `llm.client` (thread-local, valid inside `respond`) is the (host, port) of the
    connection the request came on, so a test can find the worker that sent it.
    """

    def __init__(self, respond=None, latency: float = 0.0, **options):
        self._local = threading.local()
        super().__init__(respond, latency, **options)

    @property
    def client(self) -> tuple[str, int]:
        return self._local.client

    def _handler(self):
        base = super()._handler()
        local = self._local

        class Handler(base):
            def do_POST(self):
                local.client = self.client_address
                try:
                    super().do_POST()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker that asked was killed by the test

        return Handler


class Cluster(processes.Cluster):
    def pid_of_connection(self, local_port: int, remote_port: int) -> int | None:
        """The cluster process holding the 127.0.0.1 TCP socket local_port → remote_port."""
        inode = _socket_inode(local_port, remote_port)
        if inode is None:
            return None
        target = f"socket:[{inode}]"
        for pid in self.descendants():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    continue
        return None


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    wanted = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == wanted:
            return int(fields[9])
    return None


@pytest.fixture
def llm():
    server = LiveLLM().start()
    yield server
    server.stop()


@pytest.fixture
def qcluster(transactional_db, llm, tmp_path, monkeypatch, settings) -> Callable[..., Cluster]:
    """Start a qcluster subprocess: `qcluster(workers=4, env={...})`; stopped at teardown.

    Its skills journal (skills/journal.py) is tmp_path / "journal"."""
    monkeypatch.setattr(Conf, "SYNC", False)  # this process only enqueues
    settings.ASSISTANT_LEASE_SECONDS = LEASE_SECONDS  # the reaper, when a test runs it here
    # The reaper's schedule (migration 0002) would run inside the cluster 30 s after it
    # starts, in whichever test is first on a fresh database; tests that need the reaper
    # call reap_expired() themselves, at a known moment.
    Schedule.objects.filter(func="orchestration.lifecycle.reaper.reap_expired").delete()
    started: list[Cluster] = []

    def start(*, workers: int = 4, env: dict[str, str] | None = None) -> Cluster:
        environment = {
            "ASSISTANT_LLM_PROVIDER": "openai",
            "OPENAI_BASE_URL": llm.url,
            "OPENAI_API_KEY": "test",
            "ASSISTANT_LLM_MAX_RETRIES": "0",
            "ASSISTANT_LLM_TIMEOUT_SECONDS": "30",
            "ASSISTANT_LLM_RETRY_BACKOFF_SECONDS": "0.1",
            "ASSISTANT_LEASE_SECONDS": str(LEASE_SECONDS),
            "ASSISTANT_DB_RETRY_SECONDS": str(LEASE_SECONDS - 1),  # within the lease (check W002)
            "SKILLS_JOURNAL_ROOT": str(tmp_path / "journal"),
            **(env or {}),
        }
        cluster = Cluster.start(env=environment, log_path=tmp_path / f"qcluster-{len(started)}.log", workers=workers)
        started.append(cluster)
        cluster.wait_ready()
        cluster.wait_warm(workers)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, cluster: Cluster | None = None):
    """Poll `predicate` until it returns something truthy; fail with the cluster's log."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            log = f"\nqcluster log:\n{cluster.log_tail()}" if cluster else ""
            pytest.fail(f"timed out after {timeout}s waiting for {what}{log}")
        time.sleep(0.1)
