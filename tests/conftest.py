"""Shared fixtures. The cast (as in healthchecks' tests): alice owns, bob is an outsider,
and staff is an auditor who reads the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings

PASSWORD = "correct horse battery staple"


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


def pytest_collection_modifyitems(config, items):
    """Tests marked `postgres` only mean something on PostgreSQL: skip them on SQLite."""
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
