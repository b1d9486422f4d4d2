"""A real browser against the real servers: chromium (Playwright) → daphne → the test
database ← a real qcluster → the scripted OpenAI-compatible server.

Nothing runs inline: the browser sends the message, daphne starts the turn (and so
snapshots the limits, which is why `LIMIT_*` goes to daphne too), the cluster's workers
run it, and the page learns about it only through its socket.

Playwright's sync API keeps an asyncio loop marked as running in this thread while the
browser is open, which Django reads as "async context" and refuses ORM calls. The browser
is therefore package-scoped (the loop is gone before other packages' tests run) and, for
its lifetime only, this process sets DJANGO_ALLOW_ASYNC_UNSAFE; the servers' environment
clears it again, so daphne and the workers keep Django's real async-safety checks.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from benchmarks.load import Daphne
from tests.conftest import PASSWORD
from tests.live.conftest import (  # noqa: F401 - llm and qcluster are fixtures used here
    Cluster,
    LiveLLM,
    database_url,
    llm,
    qcluster,
    wait_for,
)

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Without the background-networking switches chromium keeps calling Google's services,
# which the tests would count as outside requests (and which a closed network stalls).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts" / "browser"
WAIT_MS = 20_000


def pytest_collection_modifyitems(config, items):
    """Without chromium (`make test` installs Debian's), the browser tests cannot run."""
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    for item in items:
        if "tests/browser/" in item.nodeid:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.failed_phase = report.when  # fixtures save logs and a screenshot for failures
    return report


# --- servers ------------------------------------------------------------------------------


def server_env(llm: LiveLLM, env: dict[str, str] | None = None) -> dict[str, str]:
    """What daphne and the cluster share: the test database, the scripted LLM, limits."""
    return {
        "DATABASE_URL": database_url(),
        "ASSISTANT_LLM_PROVIDER": "openai",
        "OPENAI_BASE_URL": llm.url,
        "OPENAI_API_KEY": "test",
        "DJANGO_ALLOW_ASYNC_UNSAFE": "",  # see the module docstring
        **(env or {}),
    }


def limits_env(limits: dict[str, object]) -> dict[str, str]:
    """`{"turn_max_skill_calls": 2}` → `{"LIMIT_TURN_MAX_SKILL_CALLS": "2"}` (assistant/settings.py)."""
    return {f"LIMIT_{name.upper()}": str(value) for name, value in limits.items()}


class Reaper(threading.Thread):
    """The engine's periodic reaper, every second instead of every minute (and the
    migration's schedule row does not survive a transactional test's flush anyway):
    it hands out again work whose worker died or whose transaction was rolled back."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stopping = threading.Event()

    def run(self):
        from django.db import connection

        from orchestration.lifecycle.reaper import reap_expired

        try:
            while not self.stopping.wait(1.0):
                try:
                    reap_expired()
                except Exception:  # noqa: BLE001 - e.g. a busy database; the next round retries
                    logging.getLogger(__name__).warning("reaper round failed", exc_info=True)
        finally:
            connection.close()

    def stop(self):
        self.stopping.set()
        self.join(timeout=10)


@dataclass
class Site:
    url: str
    llm: LiveLLM
    web: Daphne
    cluster: Cluster | None
    env: dict[str, str] = field(default_factory=dict)

    def stop_web(self) -> None:
        """daphne goes away: every page's socket drops (and its extension retries)."""
        self.web.stop()

    def start_web(self) -> None:
        """daphne again, on the same port: the open pages reconnect to it."""
        self.web = Daphne.start(env=self.env, log_path=self.web.log_path, port=urlsplit(self.url).port)
        self.web.wait_ready()


@pytest.fixture
def servers(llm, qcluster, tmp_path, request) -> Callable[..., Site]:
    """Start daphne and a qcluster: `servers(limits={"turn_max_skill_calls": 2}, env={...})`."""
    started: list[Site] = []

    def start(*, limits: dict | None = None, env: dict[str, str] | None = None, workers: int = 2) -> Site:
        """`workers=0`: daphne alone, for tests that start no turn."""
        shared = server_env(llm, {**limits_env(limits or {}), **(env or {})})
        web = Daphne.start(env=shared, log_path=tmp_path / f"daphne-{len(started)}.log")
        try:
            cluster = qcluster(workers=workers, env=shared) if workers else None  # while daphne boots
            web.wait_ready()
        except BaseException:
            web.stop()
            raise
        started.append(Site(url=web.url, llm=llm, web=web, cluster=cluster, env=shared))
        return started[-1]

    reaper = Reaper()
    reaper.start()
    yield start
    reaper.stop()
    for one in started:
        one.web.stop()
        if getattr(request.node, "failed_phase", None):
            folder = artifacts_for(request.node)
            for process in (one.web, one.cluster):
                if process:
                    shutil.copy(process.log_path, folder / process.log_path.name)


@pytest.fixture(autouse=True)
def fresh_artifacts(request):
    """Each run's screenshots and logs replace the last run's (a stale failure-*.png misleads)."""
    shutil.rmtree(ARTIFACTS / _folder_name(request.node), ignore_errors=True)


def _folder_name(node) -> str:
    return re.sub(r"[^\w.-]+", "_", node.name)


def artifacts_for(node) -> Path:
    folder = ARTIFACTS / _folder_name(node)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- browser ------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def browser():
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


@dataclass
class Visitor:
    """One person's browser tab, with what it saw: dialogs, requests, console errors, and
    requests that failed (a 4xx/5xx answer, or none at all).

    At the end of every test (the `visit` fixture) no tab may have logged a console error
    or seen a failed request, except those the test declared with `expect_failure`."""

    page: object  # playwright.sync_api.Page
    base_url: str
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    expected_failures: list[re.Pattern] = field(default_factory=list)

    def __post_init__(self):
        self.page.set_default_timeout(WAIT_MS)
        self.page.on("dialog", self._dialog)
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda error: self.console_errors.append(f"uncaught: {error}"))
        self.page.on("response", lambda r: self.failed_requests.append(f"{r.status} {r.request.method} {r.url}")
                     if r.status >= 400 else None)
        self.page.on("requestfailed", self._request_failed)

    def _request_failed(self, request) -> None:
        # A beacon outlives its page by design (static/js/timezone.js): the browser still
        # delivers it when a click leaves the page, but reports it aborted there.
        if request.resource_type == "ping" and request.failure == "net::ERR_ABORTED":
            return
        # A page's static script or stylesheet still loading when the test navigates away
        # is cut short by the browser: a navigation, not a fault of the page's (a missing
        # file is a 404, which the console reports).
        if request.failure == "net::ERR_ABORTED" and "/static/" in request.url \
                and request.resource_type in ("script", "stylesheet"):
            return
        self.failed_requests.append(f"failed ({request.failure}) {request.resource_type} {request.method} {request.url}")

    def expect_failure(self, pattern: str) -> None:
        """A console error or failed request this test causes on purpose (a regex, searched)."""
        self.expected_failures.append(re.compile(pattern))

    def unexpected_errors(self) -> list[str]:
        return [text for text in self.console_errors + self.failed_requests
                if not any(pattern.search(text) for pattern in self.expected_failures)]

    def _dialog(self, dialog):
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def goto(self, path: str):
        return self.page.goto(self.base_url + path)

    def login(self, username: str, password: str = PASSWORD) -> None:
        self.goto("/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.page.click("form button[type=submit]")
        self.page.wait_for_url(self.base_url + "/")

    def new_conversation(self) -> int:
        self.goto("/")
        self.page.click("text=New conversation")
        self.page.wait_for_url(re.compile(r"/conversations/\d+/$"))
        self.wait_connected()
        return int(urlsplit(self.page.url).path.rstrip("/").rsplit("/", 1)[1])

    def wait_connected(self) -> None:
        """The socket is open (htmx's ws extension fires htmx:wsOpen on the element)."""
        self.page.wait_for_function("() => window.__socketOpen === true")

    def send(self, text: str) -> None:
        self.page.fill("#composer textarea[name=text]", text)
        with self.page.expect_response(re.compile(r"/messages/$")) as posted:
            self.page.click("#send-button")
        assert posted.value.status == 204, posted.value.text()  # the socket brings the panels

    def event_ids(self) -> list[int]:
        """Every timeline row in the page, in document order (duplicates kept)."""
        ids = self.page.eval_on_selector_all('#timeline [id^="event-"]', "rows => rows.map(r => r.id)")
        return [int(i.removeprefix("event-")) for i in ids]

    def outside_requests(self) -> list[str]:
        return [url for url in self.requests if urlsplit(url).hostname != "127.0.0.1"]

    def screenshot(self, node, name: str, selector: str | None = None) -> Path:
        from playwright.sync_api import Error

        path = artifacts_for(node) / f"{name}.png"
        if not selector:
            self.page.screenshot(path=path, full_page=True)
            return path
        for attempt in range(5):  # a push may replace the panel while it is being captured
            try:
                self.page.locator(selector).screenshot(path=path)
                return path
            except Error as error:
                if "not attached" not in str(error) or attempt == 4:
                    raise
        return path


# Marks the page once its socket is open, so tests wait for it instead of sleeping.
SOCKET_PROBE = """
document.addEventListener("htmx:wsOpen", () => { window.__socketOpen = true; });
document.addEventListener("htmx:wsClose", () => { window.__socketOpen = false; });
"""


@pytest.fixture
def visit(browser, request) -> Callable[..., Visitor]:
    """A logged-in tab on started servers: `visit(site, "alice")`; each user its own context
    (Playwright's context options too: `visit(site, "alice", timezone_id="Asia/Tokyo")`)."""
    contexts = []
    visitors: list[Visitor] = []

    def open_tab(site: Site, username: str | None = None, *, init_script: str = "", **options) -> Visitor:
        context = browser.new_context(viewport={"width": 1280, "height": 900}, **options)
        context.add_init_script(SOCKET_PROBE + init_script)
        contexts.append(context)
        visitor = Visitor(context.new_page(), site.url)
        visitors.append(visitor)
        if username:
            visitor.login(username)
        return visitor

    yield open_tab
    if getattr(request.node, "failed_phase", None):
        for i, visitor in enumerate(visitors):
            try:
                visitor.screenshot(request.node, f"failure-{i}")
            except Exception:  # noqa: BLE001 - the page may be gone; the test already failed
                pass
    for context in contexts:
        context.close()
    # whatever a test looked at, no page may have opened a dialog, called out, logged an
    # error or had a request fail (unless the test said it would)
    seen = [(v.dialogs, v.outside_requests(), v.unexpected_errors()) for v in visitors]
    assert all(seen_one == ([], [], []) for seen_one in seen), seen


# --- waiting on the database --------------------------------------------------------------

FINISHED = ("completed", "failed", "paused", "stopped")


def wait_turn(conversation_id: int, site: Site, *, statuses=FINISHED, timeout: float = 60):
    """The conversation's latest turn once its status is one of `statuses`."""
    from orchestration.models import Turn

    def settled():
        turn = Turn.objects.filter(conversation_id=conversation_id).order_by("-number").first()
        return turn if turn and turn.status in statuses else None

    return wait_for(settled, timeout=timeout, what=f"conversation {conversation_id}'s turn to reach {statuses}",
                    cluster=site.cluster)


def assert_timeline_complete(visitor: Visitor, conversation_id: int) -> list[int]:
    """Every event of the conversation is in the page exactly once (after the page caught
    up), in event-id order."""
    from orchestration.models import Event

    stored = list(Event.objects.filter(conversation_id=conversation_id).order_by("id").values_list("id", flat=True))
    assert stored, "the conversation has no events"
    visitor.page.wait_for_function(
        "ids => ids.every(id => document.getElementById('event-' + id))", arg=stored, timeout=WAIT_MS)
    shown = visitor.event_ids()
    doubled = sorted({i for i in shown if shown.count(i) > 1})
    assert doubled == [], f"rows shown more than once: {doubled}"
    assert sorted(shown) == stored
    assert shown == stored, "the timeline is not in event-id order"
    return stored


def record_events(turn, count: int, *, spacing: tuple[float, float] = (0.0, 0.0)) -> dict[int, float]:
    """Commit `count` events of `turn` (the first is `turn.started`), one per transaction:
    event id → commit time (ms since the epoch).

    From a thread of its own: this one runs Playwright's loop, where the publish after
    the commit (async_to_sync) cannot run.
    """
    from django.db import connection, transaction

    from orchestration.records.events import event_record

    committed: dict[int, float] = {}

    def commit_all():
        try:
            for i in range(count):
                with transaction.atomic():
                    stamp: list[float] = []
                    transaction.on_commit(lambda: stamp.append(time.time() * 1000))  # before the publish
                    event = event_record(type="turn.started" if i == 0 else "orchestrator.llm_call", turn=turn,
                                         summary=f"Recorded event {i}", payload={"i": i})
                committed[event.pk] = stamp[0]
                time.sleep(random.uniform(*spacing))
        finally:
            connection.close()

    writer = threading.Thread(target=commit_all)
    writer.start()
    writer.join()
    assert len(committed) == count, "the writer thread failed"
    return committed
