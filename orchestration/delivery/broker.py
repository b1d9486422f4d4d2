"""django-q2's ORM broker, woken by PostgreSQL's LISTEN/NOTIFY instead of only polling.

The ORM broker's pusher polls the queue table every Q_CLUSTER["poll"] seconds (50 ms):
each hop of a turn (the orchestrator starting agents, the last agent waking it) waited
half an interval on average, and an idle cluster queried the database 20 times a second.
On PostgreSQL every enqueue here also sends a notification, and between polls the pusher
waits for one, for up to IDLE_POLL_SECONDS: a task is taken within about a millisecond,
and an idle cluster asks once a second. SQLite has no notifications: there the broker is
django-q2's own, unchanged.

Delivery stays django-q2's: the queue table is the truth, a notification only says
"look now". One lost (a listener reconnecting) costs at most IDLE_POLL_SECONDS.

Tasks are taken oldest first, on both databases. django-q2's own read has no ORDER BY,
and PostgreSQL returns rows in the order they sit on disk: a row rewritten (its lock
renewed or cleared) or placed in space a deleted one left goes after rows queued later,
so a turn's first step could wait behind work queued after it.
"""

from __future__ import annotations

import logging
from time import sleep

import psycopg
from django.db import connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf

logger = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 1.0


class NotifyingORM(ORM):
    def enqueue(self, task):
        package_id = super().enqueue(task)
        if _postgres():
            with connections[Conf.ORM].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, '')", [_channel(self.list_key)])
        return package_id

    def dequeue(self):
        if not _postgres():
            return self._take() or sleep(Conf.POLL)  # as django-q2's: an empty queue waits a poll
        listener = _listener(self.list_key)
        if listener is not None:
            listener = listener.drain()  # before looking: what is sent after this wakes the wait
        tasks = self._take()
        if tasks:
            return tasks
        if listener is None or listener.wait(IDLE_POLL_SECONDS) is None:
            sleep(Conf.POLL)  # no listener (the database is away): poll as django-q2 does
        return None

    def _take(self) -> list[tuple[int, str]]:
        """ORM.dequeue without its sleep, in queue order: lock up to Conf.BULK due tasks
        for this cluster, oldest first."""
        queue = self.get_connection()
        taken = []
        for task in queue.filter(key=self.list_key, lock__lt=timezone.now()).order_by("id")[: Conf.BULK]:
            # another cluster may have been faster: the lock is a conditional update
            if queue.filter(id=task.id, lock=task.lock).update(lock=self.timeout(task)):  # django-q2's lock
                taken.append((task.pk, task.payload))
        return taken


def wakes_on_enqueue() -> bool:
    """Whether a task queued now is taken within about a millisecond (a notification),
    not at the pusher's next poll."""
    return _postgres()


def _postgres() -> bool:
    return connections[Conf.ORM].vendor == "postgresql"


def _channel(list_key: str | None) -> str:
    return f"django_q.{list_key or Conf.CLUSTER_NAME}"


class _Listener:
    """A connection of its own that LISTENs on the queue's channel: one per list key in
    the process that dequeues (the cluster's pusher, which never forks)."""

    def __init__(self, list_key: str):
        self.list_key = list_key
        params = connections[Conf.ORM].get_connection_params()
        self.connection = psycopg.connect(**params, autocommit=True)
        self.connection.execute(f'LISTEN "{_channel(list_key)}"')

    def drain(self) -> _Listener | None:
        """Forget notifications already here; None if the connection died."""
        try:
            for _ in self.connection.notifies(timeout=0):
                pass
        except psycopg.Error:
            return self._lost()
        return self

    def wait(self, seconds: float) -> bool | None:
        """True once a notification arrives, False after `seconds` without one, None if
        the connection died."""
        try:
            return any(True for _ in self.connection.notifies(timeout=seconds, stop_after=1))
        except psycopg.Error:
            return self._lost()

    def _lost(self) -> None:
        logger.warning("Queue listener lost its connection; polling until it reconnects")
        _listeners.pop(self.list_key, None)
        try:
            self.connection.close()
        except psycopg.Error:
            pass
        return None


_listeners: dict[str, _Listener] = {}


def _listener(list_key: str) -> _Listener | None:
    """This process's listener, connected on first use; None while the database is away."""
    if list_key not in _listeners:
        try:
            _listeners[list_key] = _Listener(list_key)
        except psycopg.Error as exc:
            logger.warning("Queue listener cannot connect (%s); polling instead", exc)
            return None
    return _listeners[list_key]
