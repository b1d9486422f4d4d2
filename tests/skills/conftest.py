"""Fixtures for the skills tests: calling skills as the engine does, a workspace in
tmp_path, and test-only skills registered for one test."""

from __future__ import annotations

import itertools

import pytest

from skills import registry
from skills.base import Domain
from skills.executor import execute_skill
from tests.factories import conversation_for, dispatch_for, turn_for


@pytest.fixture
def dispatch(alice):
    return dispatch_for(turn_for(conversation_for(alice)))


@pytest.fixture
def call(dispatch):
    """`call(name, arguments, user=alice)`: one use_skill call in alice's dispatch (or in a
    dispatch of `user`'s own), each with a fresh tool_call_id unless one is given."""
    dispatches = {dispatch.turn.conversation.owner_id: dispatch}
    ids = itertools.count(1)

    def call(name, arguments, *, user=None, tool_call_id=None, **options):
        user = user or dispatch.turn.conversation.owner
        if user.pk not in dispatches:
            dispatches[user.pk] = dispatch_for(turn_for(conversation_for(user)))
        return execute_skill(
            name=name,
            arguments=arguments,
            user=user,
            tool_call_id=tool_call_id or f"call_{next(ids)}",
            scope={"dispatch": dispatches[user.pk]},
            **options,
        )

    return call


@pytest.fixture
def ok(call):
    """`ok(name, arguments, user=...)`: the result of a call that must succeed."""

    def ok(name, arguments, **options):
        outcome = call(name, arguments, **options)
        assert outcome.ok, outcome
        return outcome.data

    return ok


@pytest.fixture(autouse=True)
def workspace(settings, tmp_path):
    """Workspaces live in tmp_path: no test writes under var/."""
    settings.SKILLS_WORKSPACE_ROOT = tmp_path / "workspaces"
    return settings.SKILLS_WORKSPACE_ROOT


@pytest.fixture(autouse=True)
def journal_root(settings, tmp_path):
    """Each test's skills journal (skills/journal.py) in its own folder, to look into."""
    settings.SKILLS_JOURNAL_ROOT = tmp_path / "journal"
    return settings.SKILLS_JOURNAL_ROOT


@pytest.fixture
def register(monkeypatch):
    """`register(*skills)`: a test-only domain "testing" in the registry for one test."""

    def register(*skills):
        domain = Domain(
            name="testing", description="Skills that exist only in tests.", skills=skills
        )
        monkeypatch.setitem(registry.DOMAINS, domain.name, domain)
        return domain

    return register
