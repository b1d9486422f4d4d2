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
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from django_q.conf import Conf
from django_q.models import Schedule

from tests.llm_server import ScriptedLLM

STARTUP_SECONDS = 30
WARM_SECONDS = 60
STOP_SECONDS = 10
LEASE_SECONDS = 5
_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b.*")


class LiveLLM(ScriptedLLM):
    """The scripted server, which also tells `respond` who is asking.

    `llm.client` (thread-local, valid inside `respond`) is the (host, port) of the
    connection the request came on, so a test can find the worker that sent it.
    """

    def __init__(self, respond=None, latency: float = 0.0):
        self._local = threading.local()
        super().__init__(respond, latency)

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


class Cluster:
    def __init__(self, process: subprocess.Popen, log_path: Path):
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        """The log's errors (with each traceback's last line), then its last lines."""
        log = self.log().splitlines()
        errors = [line for line in log if " ERROR " in line or " CRITICAL " in line
                  or _EXCEPTION_LINE.match(line)]
        return "\n".join([f"({self.log_path})", "errors:", *errors[-20:], "last lines:", *log[-lines:]])

    def descendants(self) -> list[int]:
        """Every live process below the qcluster process (Sentinel, workers, monitor, pusher)."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        found, frontier = [], [self.pid]
        while frontier:
            pid = frontier.pop()
            for child in children.get(pid, []):
                found.append(child)
                frontier.append(child)
        return found

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

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if " running." in self.log():
                return
            if self.process.poll() is not None:
                pytest.fail(f"qcluster exited with {self.process.returncode}:\n{self.log_tail()}")
            time.sleep(0.1)
        pytest.fail(f"qcluster not ready after {STARTUP_SECONDS}s:\n{self.log_tail()}")

    def wait_warm(self, workers: int) -> None:
        """Wait until every process of the cluster is spawned and idle.

        Workers warm up when spawned (orchestration/warmup.py: ~2 s of CPU each); a task
        queued meanwhile waits for a warm worker, which would distort timing assertions.
        A process counts as idle when it was seen runnable in at most 2 of its last 6
        samples (50 ms apart); warming workers are runnable all along.
        """
        seen: dict[int, list[bool]] = {}
        deadline = time.monotonic() + WARM_SECONDS
        while time.monotonic() < deadline:
            pids = self.descendants()
            for pid in pids:
                seen.setdefault(pid, []).append(_runnable(pid))
            recent = [seen[pid][-6:] for pid in pids]
            if len(pids) >= workers + 3 and all(len(r) == 6 and sum(r) <= 2 for r in recent):
                return  # the Sentinel, its monitor and pusher, and the workers
            if self.process.poll() is not None:
                pytest.fail(f"qcluster exited with {self.process.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        pytest.fail(f"qcluster's workers still busy after {WARM_SECONDS}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (graceful: workers finish their task), then SIGKILL the whole group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # stragglers: a worker stuck in a call
        except ProcessLookupError:
            pass
        self.process.wait(timeout=STOP_SECONDS)
        deadline = time.monotonic() + STOP_SECONDS
        while _group_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _runnable(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("R", "D")


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    wanted = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == wanted:
            return int(fields[9])
    return None


def database_url() -> str:
    """The URL of the database this test runs on (the test database, not the real one)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        if connection.is_in_memory_db():
            pytest.fail("the SQLite test database is in memory; a qcluster subprocess cannot see it")
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(db['NAME'], safe='')}"


@pytest.fixture
def llm():
    server = LiveLLM().start()
    yield server
    server.stop()


@pytest.fixture
def qcluster(transactional_db, llm, tmp_path, monkeypatch) -> Callable[..., Cluster]:
    """Start a qcluster subprocess: `qcluster(workers=4, env={...})`; stopped at teardown."""
    monkeypatch.setattr(Conf, "SYNC", False)  # this process only enqueues
    # The reaper's schedule (migration 0002) would run inside the cluster 30 s after it
    # starts, in whichever test is first on a fresh database; tests that need the reaper
    # call reap_expired() themselves, at a known moment.
    Schedule.objects.filter(func="orchestration.tasks.reap").delete()
    started: list[Cluster] = []

    def start(*, workers: int = 4, env: dict[str, str] | None = None) -> Cluster:
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "assistant.settings",
            "DATABASE_URL": database_url(),
            "Q_WORKERS": str(workers),
            "Q_SYNC": "0",
            "Q_LOG_LEVEL": "INFO",
            "ASSISTANT_LLM_PROVIDER": "openai",
            "OPENAI_BASE_URL": llm.url,
            "OPENAI_API_KEY": "test",
            "ASSISTANT_LLM_MAX_RETRIES": "0",
            "ASSISTANT_LLM_TIMEOUT_SECONDS": "30",
            "ASSISTANT_LEASE_SECONDS": str(LEASE_SECONDS),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        log_path = tmp_path / f"qcluster-{len(started)}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "qcluster"],
                cwd=settings.BASE_DIR, env=environment, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        cluster = Cluster(process, log_path)
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
