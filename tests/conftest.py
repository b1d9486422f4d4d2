"""Shared fixtures. The cast (as in healthchecks' tests): alice owns, bob is an outsider,
and staff is an auditor who reads the admin."""

from __future__ import annotations

import json
import os
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from tests.support.mcp_fixtures import mcp_sessions  # noqa: F401 - a fixture for every test that uses MCP servers

PASSWORD = "correct horse battery staple"

# Most tests are about other guarantees than approvals: their owners let email go out
# unasked, as an owner can (a rule or the settings). So do the servers tests start
# (daphne, qcluster: they inherit this environment). tests/orchestration/test_approvals.py
# and the approval tests in live/ and browser/ turn the real defaults back on
# (`approvals_on`, APPROVALS_ON_ENV).
EMAIL_UNASKED = {"email.send": "allow"}
os.environ["ASSISTANT_SKILL_POLICIES"] = json.dumps(EMAIL_UNASKED)
os.environ["EGRESS_ASK_NEW_RECIPIENTS"] = "0"
APPROVALS_ON_ENV = {"ASSISTANT_SKILL_POLICIES": json.dumps(settings.SKILLS_DEFAULT_POLICIES),
                    "EGRESS_ASK_NEW_RECIPIENTS": "1"}

REDIS_DATABASES = 16  # Redis's default `databases`


def own_redis_database(url: str, worker: str) -> str:
    """`url` on a database of xdist worker `worker` ("gw0", …) alone, 1 to 15 (the run's
    own, 0 or as given, stays the serial pass's). A test that flushes Redis
    (tests/live/test_faults.py) then empties only its own process's database: on a shared
    one it emptied the limiter's slots of a test running beside it, and two calls went
    out under a concurrency of one."""
    number = 1 + int(worker.removeprefix("gw")) % (REDIS_DATABASES - 1)
    return urlunsplit(urlsplit(url)._replace(path=f"/{number}"))


# Each test process its own names in the shared Redis, and so the servers it starts: the
# processes running beside it number their conversations as it does. Pub/sub channels
# (the channel layer's) are not in a database: the prefix keeps them apart.
if settings.REDIS_URL:
    os.environ["CHANNELS_PREFIX"] = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = f"test-{os.getpid()}"
    if worker := os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["REDIS_URL"] = settings.REDIS_URL = own_redis_database(settings.REDIS_URL, worker)
        for host in settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]:
            host["address"] = settings.REDIS_URL


@pytest.fixture(autouse=True, scope="session")
def quick_password_hashing():
    """The users tests make: one round of PBKDF2, not a million (tests/support/passwords.py)."""
    with override_settings(PASSWORD_HASHERS=["tests.support.passwords.OneRoundPBKDF2"]):
        yield


@pytest.fixture(autouse=True, scope="session")
def email_unasked():
    with override_settings(ASSISTANT_SKILL_POLICIES=EMAIL_UNASKED,
                           ASSISTANT_EGRESS={**settings.ASSISTANT_EGRESS, "ask_new_recipients": False}):
        yield


@pytest.fixture(autouse=True, scope="session")
def postgres_flush_by_delete():
    """Empty the tables after a transactional test with DELETE, not TRUNCATE, on
    PostgreSQL: a TRUNCATE of every table gives each a new file, 0.3 s a test here, and
    most tests are transactional (0.08 s with DELETE: the tables are small). The tables
    are locked first, as TRUNCATE would, so a straggling process's write cannot slip in
    between; the foreign keys are deferred (Django makes them deferrable), so the order of
    the DELETEs does not matter. SQLite's flush is DELETE already."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        names = [self.quote_name(table) for table in tables]
        return ["SET CONSTRAINTS ALL DEFERRED;", f"LOCK TABLE {', '.join(names)} IN SHARE ROW EXCLUSIVE MODE;",
                *(f"DELETE FROM {name};" for name in names)]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


@pytest.fixture(autouse=True, scope="session")
def postgres_sessions_ended(django_db_setup, django_db_blocker):
    """End every other session on the test database before it is dropped. A thread that
    used the database (a runner's, asgiref's) holds its connection out of the pool until
    the process ends, and DROP DATABASE refused ("being accessed by other users"), left
    the database behind and printed a warning at the end of the run."""
    yield
    if connection.vendor == "postgresql":  # from the server's own database, as Django drops it
        with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                           [connection.settings_dict["NAME"]])


@pytest.fixture(autouse=True)
def panels_unpaced(settings):
    """In-process sockets send every panel with its events (tests read a push whole),
    and their lane waits for no CPU share; the pace a real daphne keeps is tested in
    tests/web/test_panel_pace.py."""
    settings.ASSISTANT_PANEL_INTERVAL_SECONDS = 0
    settings.ASSISTANT_PANEL_CPU_SHARE = 1.0


@pytest.fixture(autouse=True)
def breakers_unremembered():
    """A clean circuit is remembered by the process (skills/breaker.py); not across tests."""
    from skills.breaker import breaker_forget

    breaker_forget()


@pytest.fixture
def approvals_on(settings):
    """The product's defaults: email.send asks, new recipients ask."""
    settings.ASSISTANT_SKILL_POLICIES = dict(settings.SKILLS_DEFAULT_POLICIES)
    settings.ASSISTANT_EGRESS = {**settings.ASSISTANT_EGRESS, "ask_new_recipients": True}


def make_user(username: str, **extra):
    return get_user_model().objects.create_user(
        username=username, email=f"{username}@example.com", password=PASSWORD, **extra
    )


@pytest.fixture(autouse=True, scope="session")
def skills_journal(tmp_path_factory):
    """Skill calls journal their effects outside the database (skills/journal.py): in
    tests, under a temporary folder, never under var/. A test inside a transaction never
    commits, so its entries are never removed."""
    with override_settings(SKILLS_JOURNAL_ROOT=tmp_path_factory.mktemp("journal")):
        yield


@pytest.fixture
def alice(db):
    return make_user("alice")


@pytest.fixture
def bob(db):
    return make_user("bob")


@pytest.fixture
def staff(db):
    return make_user("staff", is_staff=True)


@pytest.fixture
def superuser(db):
    return make_user("root", is_staff=True, is_superuser=True)


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def clock(monkeypatch):
    """`clock("2026-11-25T21:47:00+00:00")`: from then on the clock reads that time and runs
    on from it. Shifted, not stopped, so leases and deadlines pass as they would."""
    real = timezone.now

    def set_clock(at: str) -> datetime:
        shift = datetime.fromisoformat(at) - real()
        monkeypatch.setattr(timezone, "now", lambda: real() + shift)
        return timezone.now()

    return set_clock


def pytest_collection_modifyitems(config, items):
    """Tests marked `postgres` only mean something on PostgreSQL: skip them on SQLite."""
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
