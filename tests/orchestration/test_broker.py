"""The queue broker (orchestration/delivery/broker.py): django-q2's ORM broker, woken by
LISTEN/NOTIFY on PostgreSQL. A real qcluster uses it in tests/live."""

from __future__ import annotations

import pytest
from django.db import connection
from django_q.brokers import get_broker
from django_q.models import OrmQ

from orchestration.delivery import broker as broker_module
from orchestration.delivery.broker import NotifyingORM

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")


@pytest.fixture
def broker():
    queue = get_broker("test-queue")
    yield queue
    for listener in broker_module._listeners.values():
        listener.connection.close()
    broker_module._listeners.clear()


def test_the_cluster_uses_it():
    assert isinstance(get_broker(), NotifyingORM)


def test_a_task_is_taken_once_and_acknowledged(broker):
    broker.enqueue("payload-1")
    taken = broker.dequeue()
    assert [payload for _, payload in taken] == ["payload-1"]
    assert broker.dequeue() is None  # locked for Q_CLUSTER["retry"]: not handed out twice
    broker.acknowledge(taken[0][0])
    assert not OrmQ.objects.filter(key="test-queue").exists()


def test_tasks_are_taken_oldest_first(broker):
    """Even when the oldest row was rewritten since (PostgreSQL then reads it after the
    newer ones: without an ORDER BY the second task went first)."""
    for payload in ["first", "second", "third"]:
        broker.enqueue(payload)
    oldest = OrmQ.objects.filter(key="test-queue").order_by("id").first()
    OrmQ.objects.filter(pk=oldest.pk).update(lock=oldest.lock)  # a new row version, at the end
    taken = [task for _ in range(3) for task in broker.dequeue() or []]
    assert [payload for _, payload in taken] == ["first", "second", "third"]


def test_tasks_of_another_queue_are_not_taken(broker):
    get_broker("other-queue").enqueue("not mine")
    assert broker.dequeue() is None
    assert OrmQ.objects.filter(key="other-queue").count() == 1


@postgres_only
def test_an_enqueue_wakes_a_waiting_listener(broker):
    assert broker.dequeue() is None  # connects the listener, finds nothing, waits and gives up
    listener = broker_module._listeners["test-queue"]
    assert listener.wait(0.01) is False
    get_broker("test-queue").enqueue("wake up")  # as another process would, from its own broker
    assert listener.wait(30) is True
    assert [payload for _, payload in broker.dequeue()] == ["wake up"]


@postgres_only
def test_a_listener_whose_connection_died_is_replaced(broker):
    assert broker.dequeue() is None
    old = broker_module._listeners["test-queue"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [old.connection.info.backend_pid])
    broker.enqueue("after the crash")
    # the dead listener is noticed (on its next read) and dropped; the queue itself answers
    taken = [task for _ in range(3) for task in broker.dequeue() or []]
    assert [payload for _, payload in taken] == ["after the crash"]
    new = broker_module._listeners["test-queue"]  # and a new one listens again
    assert new is not old
    get_broker("test-queue").enqueue("heard")
    assert new.wait(30) is True
