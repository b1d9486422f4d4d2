"""Load (issue 7): browser-like users over htmx posts and WebSockets against real servers.

`run_load` starts the scripted LLM server (or reuses one), daphne and a qcluster against
this process's database, creates the users, then runs them concurrently for a bounded
time from one asyncio loop (httpx + websockets). Each virtual user does what the page
does for a person:

1. GET /login/, POST the form with its csrfmiddlewaretoken; GET / (the list).
2. POST "New conversation" (the list's form), follow the redirect: GET the conversation
   page (the *page* latency), and open its socket (`ws-connect`, with the session cookie
   and the page's Origin) as htmx's ws extension does.
3. Send a message as htmx does (HX-Request, X-CSRFToken from the page's `hx-headers`,
   the form's fields) — the *post* latency — and wait until the socket shows the turn's
   final event (`turn.completed`; `turn.failed`/`paused`/`stopped` count as errors).
   With `hidden` > 0, that share of the turns is spent in another tab: the page tells its
   socket it is hidden right after the post, and visible again `hidden_seconds` later,
   as the browser's visibilitychange does; such a turn's time is not sampled.
   Think a moment, send the next one; after `turns_per_conversation` turns, close the
   page (once its socket has caught up with the database) and start a new conversation.
4. Stop starting turns when the duration is over; turns in flight finish.

Every event row a socket receives (`id="event-<pk>"`) is timed on arrival; at the end
the *event* latency is arrival minus `Event.created_at` (taken by the worker just before
the INSERT, so it includes the rest of the worker's transaction), and each socket's set
of event ids is compared with the database's events of its conversation. Events held
back from a hidden tab (committed while it was hidden, received when it showed) are
left out of the event latency: nobody was looking. A socket that
closes unexpectedly reconnects to the same URL as htmx does, which replays; rows it
already had are counted as duplicates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path

from django.conf import settings
from django.db import connection

from assistant.management.commands.serve import DAPHNE
from orchestration.records.catalogue import TURN_RESTS
from tests.support.llm_server import Agent, Plan, ScriptedLLM
from tests.support.processes import (
    STARTUP_SECONDS,
    Cluster,
    ManagedProcess,
    ProcessError,
    database_url,
    production_env,
)

SKILL = ("tasks.search", {"status": "open"})
FINAL_TYPES = set(TURN_RESTS)
HTTP_TIMEOUT = 60.0
USERNAME = "load-{:03d}"
STEADY_KINDS = ("page", "post", "event", "turn")

EVENT_ROW = re.compile(r'<details class="event [^"]*" id="event-(\d+)">.*?<div class="muted">([^<]*)</div>', re.S)
_FORM_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
_HEADER_TOKEN = re.compile(r'"X-CSRFToken": "([^"]+)"')
_WS_CONNECT = re.compile(r'ws-connect="([^"]+)"')
_ASSETS = re.compile(r'<(?:script[^>]+src|link[^>]+href)="(/static/[^"]+)"')


@dataclass
class LoadConfig:
    users: int = 50
    duration: float = 180.0  # seconds during which users start turns
    latency_ms: int = 300  # the scripted LLM's answer time
    workers: int = 8  # qcluster workers
    agents: int = 2  # per turn; agent i makes 1 + (i % 2) skill calls
    turns_per_conversation: int = 2
    ramp: float = 15.0  # users start evenly spread over this many seconds
    think: float = 1.0  # mean pause between a turn's answer and the next message
    turn_timeout: float = 300.0
    settle_timeout: float = 15.0  # how long a closing page waits for its socket to catch up
    progress_every: float = 10.0
    password: str = "load-test-password-1"
    hidden: float = 0.0  # the share of turns spent in another tab (the page hidden)
    hidden_seconds: float = 3.0  # how long, from the post
    steady_after_ramp: float = 15.0  # seconds: the last users' logins are done
    debug: bool = False  # DEBUG for daphne and the workers (off: as in production)

    def plan(self) -> Plan:
        agents = [Agent(f"l{i}", ["tasks.search"], [SKILL] * (1 + i % 2), report=f"l{i}: done")
                  for i in range(self.agents)]
        return Plan(agents, answer="Load turn done.")

    @property
    def steady_from(self) -> float:
        """Where the steady window begins, in seconds from the start (it ends at `duration`)."""
        return self.ramp + self.steady_after_ramp

    @property
    def skill_calls_per_turn(self) -> int:
        return sum(1 + i % 2 for i in range(self.agents))

    @property
    def llm_calls_per_turn(self) -> int:
        return 4 + sum(2 + i % 2 for i in range(self.agents))  # orchestrator 4; agent: calls + report


# --- servers ------------------------------------------------------------------------------


class Daphne(ManagedProcess):
    """`daphne` on a socket bound here (no window in which another process takes the port)."""

    def __init__(self, process: subprocess.Popen, log_path: Path, url: str):
        super().__init__(process, log_path)
        self.url = url

    @classmethod
    def start(cls, *, env: dict[str, str], log_path: Path, port: int = 0, code: Path | None = None) -> Daphne:
        """On `port` (0: a free one; a restart takes its old one again), its output
        appended to `log_path`; `code`: another checkout's code (a benchmark's "before")."""
        environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "assistant.settings", "PYTHONUNBUFFERED": "1",
                       "DATABASE_URL": database_url(), **env}
        with socket.create_server(("127.0.0.1", port), backlog=512) as listener, open(log_path, "ab") as log:
            port = listener.getsockname()[1]
            process = subprocess.Popen(
                [*_daphne(code), "--fd", str(listener.fileno()), "assistant.asgi:application"],
                cwd=code or settings.BASE_DIR, env=environment, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=[listener.fileno()],
            )
        return cls(process, log_path, f"http://127.0.0.1:{port}")

    def wait_ready(self) -> None:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ProcessError(f"daphne exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with direct.open(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise ProcessError(f"daphne not ready after {STARTUP_SECONDS}s:\n{self.log_tail()}")


def _daphne(code: Path | None) -> list[str]:
    """Our daphne entry (assistant/webserver.py), or plain daphne for a checkout from
    before it."""
    if (Path(code or settings.BASE_DIR) / "assistant" / "webserver.py").exists():
        return DAPHNE
    return [str(Path(sys.executable).with_name("daphne"))]


def server_env(config: LoadConfig, llm_url: str) -> dict[str, str]:
    """What daphne and the workers share. REDIS_URL comes from this process's environment."""
    env = {
        "ASSISTANT_LLM_PROVIDER": "openai", "OPENAI_BASE_URL": llm_url, "OPENAI_API_KEY": "load",
        "ASSISTANT_LLM_MAX_RETRIES": "0", "ASSISTANT_LLM_TIMEOUT_SECONDS": "120",
        "DJANGO_ALLOW_ASYNC_UNSAFE": "",
        # It measures throughput, not the per-user rate limits (assistant/ratelimits.py),
        # which a virtual user at its pace reaches within minutes.
        "RATE_CONVERSATIONS_PER_HOUR": "1000000", "RATE_MESSAGES_PER_HOUR": "1000000",
    }
    if not config.debug:
        env.update(production_env())
    return env


def ensure_users(count: int, password: str) -> list[str]:
    """load-000 … with `password` (hashed once: the same hash for all)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password

    user_model = get_user_model()
    names = [USERNAME.format(i) for i in range(count)]
    hashed = make_password(password)
    existing = set(user_model.objects.filter(username__in=names).values_list("username", flat=True))
    user_model.objects.bulk_create([user_model(username=n, email=f"{n}@example.com", password=hashed)
                                    for n in names if n not in existing])
    user_model.objects.filter(username__in=names).update(password=hashed, is_active=True)
    return names


# --- measurements -------------------------------------------------------------------------


@dataclass
class SocketRecord:
    """One page's socket (its reconnects included): what it received, and when."""

    user: str
    conversation_id: int
    received: dict[int, float] = field(default_factory=dict)  # event id → arrival (epoch s)
    types: dict[int, str] = field(default_factory=dict)
    duplicates: int = 0
    reconnects: int = 0
    messages: int = 0
    catch_up_s: float | None = None  # at close: how long until it had every event in the database
    hidden: list[tuple[float, float]] = field(default_factory=list)  # (hidden, shown again), epoch s

    def held_back(self, committed: float, arrived: float) -> bool:
        """The event waited for the tab to show: committed before it showed, received after."""
        return any(committed < shown <= arrived and committed >= hid - 1.0 for hid, shown in self.hidden)


class Stats:
    def __init__(self, config: LoadConfig):
        self.config = config
        self.latencies: dict[str, list[tuple[float, float]]] = {}  # kind → (start in the run, seconds)
        self.errors: Counter[str] = Counter()
        self.error_samples: list[str] = []
        self.sockets: list[SocketRecord] = []
        self.open_sockets = 0
        self.logged_in = 0
        self.turns_started = 0
        self.turns_completed = 0
        self.turns_in_window = 0
        self.turns_hidden = 0
        self.turn_outcomes: Counter[str] = Counter()
        self.started = time.monotonic()
        self.started_epoch = time.time()
        self.deadline = self.started + config.duration

    def stopping(self) -> bool:
        return time.monotonic() >= self.deadline

    def sample(self, kind: str, seconds: float) -> None:
        self.latencies.setdefault(kind, []).append((time.monotonic() - self.started - seconds, seconds))

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < 50:
            self.error_samples.append(f"[{time.monotonic() - self.started:6.1f}s] {kind}: {detail}"[:500])

    def progress(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.turns_completed / max(elapsed, 1e-9) * 60
        events = sum(len(s.received) for s in self.sockets)
        return (f"  [{elapsed:5.0f}s] users {self.logged_in}/{self.config.users} · turns {self.turns_completed} done "
                f"({rate:.1f}/min), {self.turns_started - sum(self.turn_outcomes.values())} in flight · "
                f"sockets {self.open_sockets} open · events {events} · errors {sum(self.errors.values())}")


# --- a virtual user -----------------------------------------------------------------------


def reconnect_delay(retry: int) -> float:
    """How long htmx's ws extension waits before its next attempt ("full-jitter"):
    at random up to a second, doubling with each attempt, up to 64 s."""
    return random.random() * 2 ** min(retry, 6)


class PageSocket:
    """The conversation page's socket, read as htmx's ws extension does (no pings)."""

    def __init__(self, user: VirtualUser, record: SocketRecord, url: str):
        self.user = user
        self.record = record
        self.url = url
        self.finals: asyncio.Queue[tuple[str, int, float]] = asyncio.Queue()
        self.closing = False
        self.ws = None
        self.reader: asyncio.Task | None = None
        self.hidden_at: float | None = None  # epoch s, while the tab is hidden

    async def hide(self) -> None:
        self.hidden_at = time.time()
        await self._tell(visible=False)

    async def show(self) -> None:
        self.record.hidden.append((self.hidden_at, time.time()))
        self.hidden_at = None
        await self._tell(visible=True)

    async def _tell(self, *, visible: bool) -> None:
        """What the page's visibilitychange sends (static/js/live.js)."""
        await self.ws.send(json.dumps({"visible": visible}))

    async def open(self) -> None:
        """Connect; after a failed handshake (each one an error) try again as the page
        does, from the same page, until the run stops. Moving on to a new conversation
        instead made a user whose socket failed load three more pages at once, and an
        overloaded daphne more overloaded still."""
        for retry in count():
            try:
                self.ws = await self._connect()
                break
            except Exception as exc:  # noqa: BLE001 - reported, and tried again
                self.user.stats.error("socket open failed", f"{self.user.username}: {type(exc).__name__}: {exc}")
                if self.user.stats.stopping():
                    raise
                await asyncio.sleep(reconnect_delay(retry))
        self.user.stats.open_sockets += 1
        self.reader = asyncio.create_task(self._read())

    async def _connect(self):
        from websockets.asyncio.client import connect

        base = self.user.base_url
        return await connect(
            self.url, origin=base, additional_headers={"Cookie": self.user.cookie_header()}, proxy=None,
            ping_interval=None, open_timeout=HTTP_TIMEOUT, max_size=2**24, max_queue=None,
        )

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        stats = self.user.stats
        while True:
            try:
                async for message in self.ws:
                    self._arrived(message if isinstance(message, str) else message.decode())
            except ConnectionClosed:
                pass
            if self.closing:
                return
            code = self.ws.close_code
            stats.error("socket closed", f"{self.user.username} conversation {self.record.conversation_id}: code {code} "
                        f"{self.ws.close_reason!r}")
            stats.open_sockets -= 1
            await asyncio.sleep(1.0)  # htmx's ws extension backs off, then reconnects to the same URL
            try:
                self.ws = await self._connect()
            except Exception as exc:  # noqa: BLE001 - reported; the turn will time out
                stats.error("socket reconnect", f"{type(exc).__name__}: {exc}")
                return
            stats.open_sockets += 1
            self.record.reconnects += 1
            if self.hidden_at is not None:  # a new socket starts visible: say so again, as the page does
                await self._tell(visible=False)

    def _arrived(self, html: str) -> None:
        now = time.time()
        self.record.messages += 1
        for match in EVENT_ROW.finditer(html):
            event_id, event_type = int(match.group(1)), match.group(2).strip()
            if event_id in self.record.received:
                self.record.duplicates += 1
                continue
            self.record.received[event_id] = now
            self.record.types[event_id] = event_type
            if event_type in FINAL_TYPES:
                self.finals.put_nowait((event_type, event_id, time.monotonic()))

    async def close(self) -> None:
        """Like leaving the page, once the socket has every event the database has."""
        started = time.monotonic()
        deadline = started + self.user.stats.config.settle_timeout
        while True:
            stored = await asyncio.to_thread(event_ids, self.record.conversation_id)
            if stored <= self.record.received.keys():
                self.record.catch_up_s = round(time.monotonic() - started, 3)
                break
            if time.monotonic() > deadline:
                break  # the final check reports what is missing
            await asyncio.sleep(0.25)
        self.closing = True
        await self.ws.close()
        if self.reader:
            await self.reader
        self.user.stats.open_sockets -= 1


def event_ids(conversation_id: int) -> set[int]:
    """From a worker thread of the driver's loop (no event loop there, so the ORM is allowed)."""
    from orchestration.models import Event

    try:
        return set(Event.objects.filter(conversation_id=conversation_id).values_list("id", flat=True))
    finally:
        connection.close()


class VirtualUser:
    def __init__(self, index: int, base_url: str, stats: Stats):
        import httpx

        self.index = index
        self.username = USERNAME.format(index)
        self.base_url = base_url
        self.stats = stats
        self.http = httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT, follow_redirects=False,
                                      trust_env=False, headers={"User-Agent": "assistant-load/1"})
        self.turn_number = 0
        self.list_page = None
        self.hidden_owed = 0.0  # `hidden` turns add up: every turn that reaches one is spent in another tab

    def cookie_header(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.http.cookies.jar)

    async def request(self, kind: str, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs):
        """One timed request; a failure (an exception or an unexpected status) is an error."""
        started = time.perf_counter()
        try:
            response = await self.http.request(method, path, **kwargs)
        except Exception as exc:  # noqa: BLE001 - httpx errors, timeouts: all reported
            self.stats.error(f"{kind} failed", f"{method} {path}: {type(exc).__name__}: {exc}")
            return None
        if response.status_code not in expect:
            self.stats.error(f"{kind} HTTP {response.status_code}", f"{method} {path}: {response.text[:200]!r}")
            return None
        self.stats.sample(kind, time.perf_counter() - started)
        return response

    def _form_headers(self, referer: str) -> dict[str, str]:
        return {"Origin": self.base_url, "Referer": self.base_url + referer}

    async def run(self) -> None:
        config = self.stats.config
        await asyncio.sleep(config.ramp * self.index / max(config.users, 1))
        try:
            if not await self.login():
                return
            self.stats.logged_in += 1
            while not self.stats.stopping():
                try:
                    await self.conversation()
                except Exception as exc:  # noqa: BLE001 - one bad conversation is an error, not the end
                    self.stats.error("exception", f"{self.username}: {type(exc).__name__}: {exc}\n"
                                     + "".join(traceback.format_exception(exc)[-3:]))
                    await asyncio.sleep(1.0)
        finally:
            await self.http.aclose()

    async def login(self) -> bool:
        page = await self.request("login page", "GET", "/login/")
        if page is None:
            return False
        token = _FORM_TOKEN.search(page.text)
        response = await self.request(
            "login", "POST", "/login/", expect=(302,), headers=self._form_headers("/login/"),
            data={"csrfmiddlewaretoken": token.group(1) if token else "", "username": self.username,
                  "password": self.stats.config.password, "next": ""})
        if response is None:
            return False
        if response.headers.get("location") != "/":
            self.stats.error("login refused", f"{self.username}: redirected to {response.headers.get('location')}")
            return False
        self.list_page = await self.request("list", "GET", "/")
        if self.list_page is not None:
            for asset in dict.fromkeys(_ASSETS.findall(self.list_page.text)):  # once: the browser caches them
                await self.request("static", "GET", asset)
        return self.list_page is not None

    async def conversation(self) -> None:
        config = self.stats.config
        listing = self.list_page or await self.request("list", "GET", "/")
        self.list_page = None
        if listing is None:
            await asyncio.sleep(1.0)
            return
        token = _FORM_TOKEN.search(listing.text)
        created = await self.request("create", "POST", "/conversations/new/", expect=(302,),
                                     headers=self._form_headers("/"),
                                     data={"csrfmiddlewaretoken": token.group(1) if token else ""})
        if created is None:
            await asyncio.sleep(1.0)
            return
        path = created.headers["location"]
        conversation_id = int(path.rstrip("/").rsplit("/", 1)[1])
        page = await self.request("page", "GET", path)
        if page is None:
            return
        ws_path = _WS_CONNECT.search(page.text).group(1)
        header_token = _HEADER_TOKEN.search(page.text).group(1)
        form_token = _FORM_TOKEN.search(page.text).group(1)
        record = SocketRecord(user=self.username, conversation_id=conversation_id)
        self.stats.sockets.append(record)
        socket_ = PageSocket(self, record, "ws" + self.base_url.removeprefix("http") + ws_path)
        try:
            await socket_.open()
        except Exception:  # noqa: BLE001 - reported by open(); the run is over
            return
        try:
            for _ in range(config.turns_per_conversation):
                if self.stats.stopping() or not await self.turn(socket_, path, header_token, form_token):
                    break
                await asyncio.sleep(random.uniform(0.5, 1.5) * config.think)
        finally:
            await socket_.close()
        self.list_page = await self.request("list", "GET", "/")  # back to the list

    async def turn(self, socket_: PageSocket, path: str, header_token: str, form_token: str) -> bool:
        stats = self.stats
        self.turn_number += 1
        started = time.monotonic()
        posted = await self.request(
            "post", "POST", path + "messages/", expect=(204,),  # the socket brings the panels
            headers={"HX-Request": "true", "HX-Current-URL": self.base_url + path, "X-CSRFToken": header_token,
                     **self._form_headers(path)},
            data={"csrfmiddlewaretoken": form_token, "text": f"Load test {self.username}, message {self.turn_number}"})
        if posted is None:
            return False
        stats.turns_started += 1
        self.hidden_owed += stats.config.hidden
        hidden = self.hidden_owed >= 1
        if hidden:
            self.hidden_owed -= 1
            stats.turns_hidden += 1
            await socket_.hide()
            await asyncio.sleep(stats.config.hidden_seconds)
            await socket_.show()
        try:
            event_type, event_id, seen = await asyncio.wait_for(socket_.finals.get(), stats.config.turn_timeout)
        except asyncio.TimeoutError:
            stats.turn_outcomes["timeout"] += 1
            stats.error("turn timeout", f"{self.username} {path}: no final event after {stats.config.turn_timeout}s")
            return False
        outcome = event_type.removeprefix("turn.")
        stats.turn_outcomes[outcome] += 1
        if outcome != "completed":
            stats.error(f"turn {outcome}", f"{self.username} {path} (event {event_id})")
            return False
        stats.turns_completed += 1
        stats.turns_in_window += seen <= stats.deadline
        if not hidden:
            stats.sample("turn", seen - started)
        return True


# --- the run ------------------------------------------------------------------------------


async def _drive(config: LoadConfig, base_url: str, stats: Stats, out: Callable[[str], None],
                 cpu_now: Callable[[], dict[str, float]]) -> dict[str, float] | None:
    """Run the users; return the CPU seconds each process used in the steady window."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    users = [VirtualUser(i, base_url, stats) for i in range(config.users)]
    tasks = [asyncio.create_task(user.run()) for user in users]

    async def report():
        while True:
            await asyncio.sleep(config.progress_every)
            out(stats.progress())

    async def steady_cpu():
        """As the steady latencies are: after the ramp and the logins (PBKDF2 is about
        half a CPU-second a login, all in daphne), until the end of the duration."""
        if config.duration <= config.steady_from:
            return None
        await asyncio.sleep(max(0.0, stats.started + config.steady_from - time.monotonic()))
        begin = await asyncio.to_thread(cpu_now)
        await asyncio.sleep(max(0.0, stats.deadline - time.monotonic()))
        end = await asyncio.to_thread(cpu_now)
        return {name: end[name] - begin[name] for name in begin}

    reporter = asyncio.create_task(report())
    steady = asyncio.create_task(steady_cpu())
    limit = config.ramp + config.duration + config.turn_timeout + config.settle_timeout + 60
    done, pending = await asyncio.wait(tasks, timeout=limit)
    reporter.cancel()
    for task in pending:
        stats.error("unfinished", f"a user still busy {limit:.0f}s after the start")
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10)
    for task in done:
        if task.exception():
            stats.error("exception", repr(task.exception()))
    await asyncio.wait({steady}, timeout=10)  # done at the deadline, before the users' last turns
    return steady.result() if steady.done() else None


def run_load(config: LoadConfig, *, server: ScriptedLLM | None = None, log_dir: Path,
             out: Callable[[str], None] = print) -> dict:
    """Start the servers on this process's database, run the users, check and report."""
    from orchestration.models import Event, Turn

    own_server = server is None
    server = server or ScriptedLLM().start()
    server.respond, server.latency = config.plan(), config.latency_ms / 1000
    requests_before, llm_errors_before = len(server.requests), len(server.errors)
    ensure_users(config.users, config.password)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = server_env(config, server.url)
    web = Daphne.start(env=env, log_path=log_dir / "daphne.log")
    cluster = None
    try:
        cluster = Cluster.start(env=env, log_path=log_dir / "qcluster.log", workers=config.workers)
        cluster.wait_ready()
        warm = cluster.wait_warm(config.workers)
        web.wait_ready()
        out(f"{setup_name()}, daphne {web.url}, {config.workers} workers (warm after {warm:.1f}s), "
            f"LLM {config.latency_ms} ms; logs in {log_dir}")
        out(f"{config.users} users for {config.duration:.0f}s (ramp {config.ramp:.0f}s), {config.agents} agents "
            f"and {config.skill_calls_per_turn} skill calls per turn, {config.turns_per_conversation} turns per page")
        def cpu_now() -> dict[str, float]:
            return {"daphne": cpu_seconds(web), "qcluster": cpu_seconds(cluster), "driver": _own_cpu(),
                    **services_cpu()}

        cpu_before = cpu_now()
        ticks_before = _machine_ticks()
        stats = Stats(config)
        steady_cpu = asyncio.run(_drive(config, web.url, stats, out, cpu_now))
        wall = time.monotonic() - stats.started
        cpu_after = cpu_now()
        cpu = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
        busy, total = (after - before for after, before in zip(_machine_ticks(), ticks_before))
        peak = {"daphne": peak_rss_mb(web), "qcluster (largest process)": peak_rss_mb(cluster)}
        out(stats.progress())
    finally:
        web.stop()
        if cluster:
            cluster.stop()
        if own_server:
            server.stop()

    # every socket against the database
    conversation_ids = [s.conversation_id for s in stats.sockets]
    stored: dict[int, dict[int, float]] = {cid: {} for cid in conversation_ids}
    for event_id, conversation_id, created_at in Event.objects.filter(
            conversation_id__in=conversation_ids).values_list("id", "conversation_id", "created_at"):
        stored[conversation_id][event_id] = created_at.timestamp()
    mismatched, event_latency, held_back = [], [], 0
    for record in stats.sockets:
        in_db = stored[record.conversation_id]
        missing = sorted(in_db.keys() - record.received.keys())
        extra = sorted(record.received.keys() - in_db.keys())
        if missing or extra:
            mismatched.append({"user": record.user, "conversation": record.conversation_id,
                               "missing": missing[:20], "extra": extra[:20], "missing_count": len(missing)})
            stats.error("socket != database", f"conversation {record.conversation_id}: {len(missing)} missing, "
                        f"{len(extra)} extra")
        for event_id, arrived in record.received.items():
            if event_id not in in_db:
                continue
            if record.held_back(in_db[event_id], arrived):
                held_back += 1
            else:
                event_latency.append((in_db[event_id] - stats.started_epoch, arrived - in_db[event_id]))
    turn_status = Counter(Turn.objects.filter(conversation_id__in=conversation_ids).values_list("status", flat=True))
    llm_errors = server.errors[llm_errors_before:]
    for message in llm_errors:
        stats.error("LLM server", message)
    llm_requests = len(server.requests) - requests_before

    samples = {**stats.latencies, "event": event_latency}
    steady_from = config.steady_from
    events_received = sum(len(s.received) for s in stats.sockets)
    catch_up = [s.catch_up_s for s in stats.sockets if s.catch_up_s is not None]
    return {
        "measured_at": _now_label(),
        "machine": _machine(),
        "setup": setup_name(),
        "config": {**asdict(config), "password": "…", "skill_calls_per_turn": config.skill_calls_per_turn,
                   "llm_calls_per_turn": config.llm_calls_per_turn},
        "wall_s": round(wall, 1),
        "turns": {
            "started": stats.turns_started, "completed": stats.turns_completed,
            "completed_in_window": stats.turns_in_window,
            "per_minute": round(stats.turns_in_window / config.duration * 60, 1),
            "outcomes": dict(stats.turn_outcomes), "in_database": dict(turn_status),
        },
        "latency_ms": {kind: latency_figures([v for _, v in values]) for kind, values in sorted(samples.items())},
        # after the ramp and the logins (PBKDF2 on 2 cores), until the end of the duration
        "steady_from_s": steady_from,
        "steady_latency_ms": {kind: latency_figures([v for t, v in values if steady_from <= t <= config.duration])
                              for kind, values in sorted(samples.items()) if kind in STEADY_KINDS},
        "events": {"received": events_received, "in_database": sum(len(v) for v in stored.values()),
                   "per_second": round(events_received / max(wall, 1e-9), 1), "held_back_from_hidden_tabs": held_back},
        "hidden_turns": stats.turns_hidden,
        "sockets": {"count": len(stats.sockets), "equal_to_database": len(stats.sockets) - len(mismatched),
                    "mismatched": mismatched[:20], "duplicates": sum(s.duplicates for s in stats.sockets),
                    "reconnects": sum(s.reconnects for s in stats.sockets),
                    "messages": sum(s.messages for s in stats.sockets),
                    "catch_up_at_close_ms": latency_figures(catch_up)},
        "errors": {"total": sum(stats.errors.values()), "by_kind": dict(stats.errors),
                   "samples": stats.error_samples},
        "llm_requests": llm_requests,
        "cpu_seconds": {name: round(seconds, 1) for name, seconds in cpu.items()},
        "steady_cpu_seconds": {name: round(seconds, 1) for name, seconds in (steady_cpu or {}).items()},
        "machine_cpu_busy_pct": round(100 * busy / max(total, 1), 1),
        "peak_rss_mb": peak,
        "logs": {"daphne": str(web.log_path), "qcluster": str(cluster.log_path)},
    }


def latency_figures(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000, 1)

    return {"n": len(ordered), "p50": at(0.5), "p95": at(0.95), "max": round(ordered[-1] * 1000, 1),
            "mean": round(statistics.fmean(ordered) * 1000, 1)}


def cpu_seconds(process: ManagedProcess) -> float:
    return sum(s.cpu_seconds for s in process.stats())


def peak_rss_mb(process: ManagedProcess) -> float:
    return round(max((s.peak_rss_mb for s in process.stats()), default=0.0), 1)


def services_cpu() -> dict[str, float]:
    """CPU seconds of this machine's PostgreSQL and Redis servers so far (their exited
    children included: a PostgreSQL backend per connection)."""
    procs: dict[int, tuple[str, int, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            procs[int(entry)] = (name, int(fields[1]), fields)
    totals = {"postgres": 0.0, "redis": 0.0}
    for name, parent, fields in procs.values():
        service = "postgres" if name == "postgres" else "redis" if name.startswith("redis-server") else None
        if service is None:
            continue
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        if procs.get(parent, ("",))[0] != name:  # the server's main process: its reaped children too
            ticks += int(fields[13]) + int(fields[14])
        totals[service] += ticks / os.sysconf("SC_CLK_TCK")
    return totals


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def setup_name() -> str:
    return ("PostgreSQL" if connection.vendor == "postgresql" else "SQLite") + (
        " + Redis" if settings.REDIS_URL else " (in-memory channel layer)")


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def _now_label() -> str:
    from django.utils import timezone

    return timezone.now().strftime("%Y-%m-%d %H:%M UTC")


LATENCY_ROWS = [("page", "conversation page (GET)"), ("post", "message post (htmx)"),
                ("event", "event: commit → socket"), ("turn", "turn: post → final event"),
                ("list", "list page (GET)"), ("create", "new conversation (POST)"), ("login", "login (POST)")]


def _steady_cpu_lines(report: dict) -> list[str]:
    """The steady window's CPU, and daphne's share of the qcluster's there (issue 27 aims
    at under a third)."""
    steady = report.get("steady_cpu_seconds")
    if not steady:
        return []
    share = f"; daphne / qcluster {steady['daphne'] / steady['qcluster']:.2f}" if steady.get("qcluster") else ""
    return [f"{'CPU s, steady state':<26} " + ", ".join(f"{k} {v}" for k, v in steady.items())
            + f" ({report['steady_from_s']:.0f}–{report['config']['duration']:.0f} s{share})"]


def table(report: dict) -> str:
    """The readable summary of a report."""
    turns, sockets, errors = report["turns"], report["sockets"], report["errors"]
    config = report["config"]
    lines = [
        f"{report['setup']} · {config['users']} users · {config['duration']:.0f} s · {config['workers']} workers · "
        f"LLM {config['latency_ms']} ms · {config['agents']} agents/turn"
        + (f" · {report['hidden_turns']} turns in a hidden tab ({config['hidden_seconds']:g} s each)"
           if config.get("hidden") else ""),
        f"{'throughput':<26} {turns['per_minute']:>8.1f} turns/min ({turns['completed_in_window']} in "
        f"{config['duration']:.0f} s; {turns['completed']} completed in all, {turns['started']} started)",
        f"{'events':<26} {report['events']['received']:>8} received ({report['events']['per_second']}/s)",
        f"{'errors':<26} {errors['total']:>8}" + (f"  {errors['by_kind']}" if errors["total"] else ""),
        f"{'sockets == database':<26} {sockets['equal_to_database']:>4}/{sockets['count']:<3} "
        f"(duplicates {sockets['duplicates']}, reconnects {sockets['reconnects']})",
        f"{'CPU s':<26} " + ", ".join(f"{k} {v}" for k, v in report["cpu_seconds"].items())
        + f" (machine {report['machine_cpu_busy_pct']:.0f} % busy)",
        *_steady_cpu_lines(report),
        "",
        f"{'latency (ms)':<26} {'n':>6} {'p50':>8} {'p95':>8} {'max':>8}",
    ]
    for kind, label in LATENCY_ROWS:
        figures = report["latency_ms"].get(kind, {"n": 0})
        if figures["n"]:
            lines.append(f"{label:<26} {figures['n']:>6} {figures['p50']:>8.0f} {figures['p95']:>8.0f} "
                         f"{figures['max']:>8.0f}")
    steady = {kind: figures for kind, figures in report["steady_latency_ms"].items() if figures["n"]}
    if steady:
        lines += ["", f"steady state ({report['steady_from_s']:.0f}–{config['duration']:.0f} s)"]
        for kind, label in LATENCY_ROWS:
            if kind in steady:
                figures = steady[kind]
                lines.append(f"{label:<26} {figures['n']:>6} {figures['p50']:>8.0f} {figures['p95']:>8.0f} "
                             f"{figures['max']:>8.0f}")
    return "\n".join(lines)
