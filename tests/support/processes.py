"""Start, watch and stop a real `manage.py qcluster` (the benchmark and the tests use it).

Process tree: `qcluster` (its own session and process group) → the Sentinel → workers,
monitor and pusher. `stop` sends SIGTERM, then SIGKILLs the whole group, so nothing is
left behind. /proc gives CPU time and peak memory per process.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

STARTUP_SECONDS = 30
STOP_SECONDS = 10
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b.*")


class ProcessError(RuntimeError):
    pass


def database_url() -> str:
    """The URL of the database this process uses (in tests: the test database)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        if connection.is_in_memory_db():
            raise ProcessError("the SQLite database is in memory; another process cannot see it")
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(db['NAME'], safe='')}"


def production_env() -> dict[str, str]:
    """DEBUG off, as in production (no query log, no debug pages), on plain HTTP on loopback.

    The secret key is this process's: django-q2 signs the tasks this process enqueues."""
    return {"DEBUG": "0", "SECRET_KEY": settings.SECRET_KEY, "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0",
            "SECURE_HSTS_SECONDS": "0"}


@contextmanager
def serving(log_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`manage.py serve *args` on a free port, as a user runs it: (its URL, its process)
    once /healthz answers; stopped (the whole process group) at the end."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "assistant.settings", "DATABASE_URL": database_url(),
                   **production_env(), **(env or {})}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "manage.py", "serve", *args, "--port", str(port)],
                                   cwd=settings.BASE_DIR, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise ProcessError(f"manage.py serve did not start:\n{log_path.read_text()}") from None
                time.sleep(0.1)
        yield url, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@dataclass
class ProcessStats:
    pid: int
    name: str
    cpu_seconds: float
    peak_rss_mb: float


def process_stats(pid: int) -> ProcessStats | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat.rsplit(")", 1)[1].split()
    # utime + stime, and cutime + cstime: the CPU of children it reaped (a qcluster's
    # workers recycled during a run would otherwise take theirs with them).
    cpu = sum(int(value) for value in fields[11:15]) / CLOCK_TICKS
    hwm = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), "0")
    return ProcessStats(pid=pid, name=name, cpu_seconds=cpu, peak_rss_mb=int(hwm) / 1024)


def pss_mb(pid: int) -> float:
    """The process's proportional set size: its private memory plus its share of what it
    shares (forked workers share their parent's pages), so a sum over processes is the
    memory they take together, which summed RSS overstates."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    kb = next((line.split()[1] for line in rollup.splitlines() if line.startswith("Pss:")), "0")
    return int(kb) / 1024


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


class ManagedProcess:
    """A subprocess in its own process group, with its output in a log file."""

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
        return descendants(self.pid)

    def stats(self) -> list[ProcessStats]:
        found = [process_stats(pid) for pid in [self.pid, *self.descendants()]]
        return [s for s in found if s is not None]

    def stop(self) -> None:
        """SIGTERM (graceful: workers finish their task), then SIGKILL the whole group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=STOP_SECONDS)
        deadline = time.monotonic() + STOP_SECONDS
        while _group_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


class Cluster(ManagedProcess):
    """A `manage.py qcluster` on this process's database."""

    @classmethod
    def start(cls, *, env: dict[str, str], log_path: Path, workers: int) -> Cluster:
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "assistant.settings",
            "DATABASE_URL": database_url(),
            "Q_WORKERS": str(workers),
            "Q_SYNC": "0",
            "Q_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "qcluster"],
                cwd=settings.BASE_DIR, env=environment, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        return cls(process, log_path)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if " running." in self.log():
                return
            if self.process.poll() is not None:
                raise ProcessError(f"qcluster exited with {self.process.returncode}:\n{self.log_tail()}")
            time.sleep(0.1)
        raise ProcessError(f"qcluster not ready after {STARTUP_SECONDS}s:\n{self.log_tail()}")

    def wait_warm(self, workers: int, *, timeout: float = 60) -> float:
        """Wait until every process of the cluster is spawned and idle; return the seconds.

        Workers warm up when spawned (orchestration/worker/warmup.py: ~2 s of CPU each); a task
        queued meanwhile waits for a warm worker, which would distort any timing. A
        process counts as idle when it was runnable in at most 2 of its last 6 samples
        (50 ms apart); warming workers are runnable all along.
        """
        started = time.monotonic()
        seen: dict[int, list[bool]] = {}
        while time.monotonic() - started < timeout:
            pids = self.descendants()
            for pid in pids:
                seen.setdefault(pid, []).append(_runnable(pid))
            recent = [seen[pid][-6:] for pid in pids]
            if len(pids) >= workers + 3 and all(len(r) == 6 and sum(r) <= 2 for r in recent):
                return time.monotonic() - started  # the Sentinel, monitor, pusher and workers
            if self.process.poll() is not None:
                raise ProcessError(f"qcluster exited with {self.process.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise ProcessError(f"qcluster's workers still busy after {timeout}s:\n{self.log_tail()}")


def _runnable(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("R", "D")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
