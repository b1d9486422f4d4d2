"""Turn DATABASE_URL into Django's DATABASES entry.

SQLite is the embedded default and is shared by the web server and several qcluster
worker processes, so it runs in WAL mode with IMMEDIATE transactions: writers queue on
the busy timeout instead of failing with "database is locked" when a read lock would
have to be upgraded.

The SQLite test database is a file too (not Django's in-memory default), one per test
process: tests that start a real `qcluster` subprocess point it at that file.

On PostgreSQL, parameters are bound by the server and a connection prepares a statement
the second time it runs it. Django's default for psycopg 3 quotes every parameter into the
SQL text in Python and prepares nothing, so the server parsed and planned each of a
step's few statements, the same few thousands of times a minute, every time (PostgreSQL's
CPU per model call under load: 2.6 ms → 2.2 ms). Behind a PgBouncer in transaction mode
that does not keep prepared statements (before 1.21, or without max_prepared_statements),
set DB_PREPARED_STATEMENTS=0.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


POSTGRES_PREPARE_THRESHOLD = 1  # unprepared runs of a statement on a connection: its second is prepared


def database_from_url(url: str, *, default_sqlite_path: Path, prepared_statements: bool = True) -> dict:
    if not url:
        url = f"sqlite:///{default_sqlite_path}"
    try:
        config = dj_database_url.parse(url, conn_max_age=0)
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not usable: {exc}") from None
    engine = config["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        if config["NAME"] != ":memory:":
            path = Path(config["NAME"])
            path.parent.mkdir(parents=True, exist_ok=True)
            test = config.setdefault("TEST", {})
            test.setdefault("NAME", str(path.with_name(f"test-{path.stem}-{os.getpid()}.sqlite3")))
        config["OPTIONS"] = {**SQLITE_OPTIONS, **config.get("OPTIONS", {})}
    elif engine == "django.db.backends.postgresql":
        config["OPTIONS"] = {"server_side_binding": True,
                             "prepare_threshold": POSTGRES_PREPARE_THRESHOLD if prepared_statements else None,
                             **config.get("OPTIONS", {})}
    else:
        raise ImproperlyConfigured(
            f"DATABASE_URL must point at SQLite or PostgreSQL, not {engine!r}."
        )
    return config


REDIS_SOCKET_TIMEOUT = 15  # seconds: a Redis that stops answering fails a publish, not hangs it


def channel_layers_from_url(redis_url: str, *, prefix: str = "assistant") -> dict:
    """channels_redis's pub/sub layer when REDIS_URL is set; the in-memory layer otherwise.

    The in-memory layer only reaches consumers in the same process; the dashboard's
    consumer also replays from the Event table, so pages still see workers' events.

    Pub/sub, not channels_redis's default layer: that one hands a web process its
    messages one at a time, four Redis round trips each (a script, a blocking pop and
    two writes to a backup queue), in one queue behind one lock for all its sockets. Under
    `make load` that queue fell seconds behind the workers (an event reached its page
    1.8 s after its commit at p50); Redis pushes a pub/sub message to every subscribed
    process at once. What pub/sub does not give (a message survives a process that was
    not listening) the pages never relied on: delivery is at most once, and a socket
    reads the event log on connect and whenever its conversation's watch sees an event
    no message told of (assistant/watch.py).
    """
    if redis_url:
        return {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {"hosts": [{"address": redis_url, "socket_timeout": REDIS_SOCKET_TIMEOUT}],
                           "prefix": prefix},
            }
        }
    return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


CHANNEL_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,60}")  # channels' name characters, room for the rest of a name


def channel_prefix(database: dict, chosen: str = "") -> str:
    """The channel layer's prefix for its names in Redis: `chosen` (CHANNELS_PREFIX), or
    else one for each database.

    A conversation's group is named by its number, and numbers repeat across databases:
    two deployments sharing one Redis (or two test runs) under channels' default prefix
    would each push the other's events to the sockets of their conversations with the
    same numbers: one user's rows on another's page. The web processes and the workers
    of one deployment share a database, so they share the prefix."""
    if chosen:
        if not CHANNEL_PREFIX.fullmatch(chosen):
            raise ImproperlyConfigured(
                f"CHANNELS_PREFIX must be 1 to 60 ASCII letters, digits, hyphens, underscores or periods, not {chosen!r}.")
        return chosen
    identity = "|".join(str(database.get(key) or "") for key in ("ENGINE", "HOST", "PORT", "NAME"))
    return "assistant-" + hashlib.sha256(identity.encode()).hexdigest()[:16]
