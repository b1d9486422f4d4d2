"""Transient database errors retry the step on a fresh connection, for every role alike
(issue 25): no answer asked again, no side effect twice."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, OperationalError

from orchestration.delivery.dbretry import is_transient
from orchestration.engine import agent as agent_role
from orchestration.engine import orchestrator as orchestrator_role
from orchestration.models import AgentDispatch, LLMCall
from skills.domains.tasks.models import Task
from tests.support.llm_server import Agent, Plan


class _Cause(Exception):
    def __init__(self, sqlstate: str | None):
        super().__init__(sqlstate or "no sqlstate")
        self.sqlstate = sqlstate


def _error(sqlstate: str | None, kind=OperationalError) -> Exception:
    error = kind("boom")
    error.__cause__ = _Cause(sqlstate)
    return error


@pytest.mark.parametrize("sqlstate", ["40001", "40P01", "08006", "57P01", "57P03"])
def test_what_is_worth_another_try(sqlstate):
    assert is_transient(_error(sqlstate))


def test_a_lost_connection_has_no_sqlstate_and_sqlite_says_locked():
    from django.db import connection

    if connection.vendor == "sqlite":
        assert is_transient(OperationalError("database is locked"))
        assert not is_transient(OperationalError("no such table: x"))
    else:
        assert is_transient(_error(None))


@pytest.mark.parametrize("error", [_error("57014"), _error("42P01"), _error("23505", IntegrityError), ValueError()])
def test_what_would_fail_the_same_way_again(error):
    assert not is_transient(error)


def once(fn, error: Exception):
    """`fn`, but its first call raises `error` (after doing its work, if `after`)."""
    raised = []

    def flaky(*args, **kwargs):
        if not raised:
            raised.append(True)
            raise error
        return fn(*args, **kwargs)

    return flaky, raised


pytestmark = pytest.mark.django_db(transaction=True)
PLAN = Plan([Agent("maker", ["tasks.create"], [("tasks.create", {"title": "once"})])], answer="Done.")


@pytest.mark.parametrize("role, method", [(agent_role.Agent, "store"), (orchestrator_role.Orchestrator, "store"),
                                          (agent_role.Agent, "before_call"), (agent_role.Agent, "end")])
def test_a_serialization_failure_retries_without_asking_again(llm, run_turn, monkeypatch, role, method):
    llm.respond = PLAN
    flaky, raised = once(getattr(role, method), _error("40001"))
    monkeypatch.setattr(role, method, flaky)
    turn = run_turn()
    assert raised and turn.status == "completed", turn.error
    assert len(llm.requests) == LLMCall.objects.filter(turn=turn).count() == 6  # nobody asked twice
    assert list(Task.objects.values_list("title", flat=True)) == ["once"]
    assert AgentDispatch.objects.get(turn=turn).outcome == "completed"


def test_a_connection_lost_after_a_skill_ran_replays_it_without_running_it_again(llm, run_turn, monkeypatch):
    llm.respond = PLAN
    use_skill = agent_role._use_skill
    lost = []

    def then_the_connection_drops(*args, **kwargs):
        content = use_skill(*args, **kwargs)
        if not lost:
            lost.append(True)
            raise _error("08006")
        return content

    monkeypatch.setattr(agent_role, "_use_skill", then_the_connection_drops)
    turn = run_turn()
    assert lost and turn.status == "completed", turn.error
    assert list(Task.objects.values_list("title", flat=True)) == ["once"]  # replayed, not run again
    assert len(llm.requests) == 6


def test_an_error_that_is_not_transient_fails_the_agent_at_once(llm, run_turn, monkeypatch):
    llm.respond = PLAN
    flaky, raised = once(agent_role.Agent.store, _error("42P01"))
    monkeypatch.setattr(agent_role.Agent, "store", flaky)
    turn = run_turn()
    maker = AgentDispatch.objects.get(turn=turn)
    assert raised and maker.outcome == "failed" and "OperationalError" in maker.error
