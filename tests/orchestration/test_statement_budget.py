"""The engine's hot paths have a statement budget (as Zulip's `assert_database_query_count`
guards theirs): a step that gains a statement fails here, so the change that adds it says
so in its diff, with the budget raised beside it.

Counted on the worker's connection between one model request and the next, inline
(django-q2 sync), against the scripted model server; transaction control apart, and what
is not the engine's step (the skill handler's own reads, the reads a process makes every
so often whatever its steps): tests/support/statements.py, which the bench counts by too.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.db import connection, connections
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

import orchestration.worker.tasks  # noqa: F401 (registers the runner's jobs)
from orchestration.budgets.spending import spend_periods_start
from orchestration.delivery import runner as runner_module
from orchestration.delivery.runner import Runner
from orchestration.lifecycle.turns import turn_start
from orchestration.models import Turn
from tests.factories import conversation_for
from tests.support.llm_server import Agent, Plan, agent_of
from tests.support.statements import CONTROL, NOT_THE_STEPS

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = ("tasks.search", {"status": "open"})

# The budgets. Raise one only with the feature that needs it, and say so in its diff.
AGENT_STEP = 4  # answer, the turn's counters (and the lease), the calls run ahead, the events
AGENT_STEP_COMMITS = 1
ORCHESTRATOR_STEPS = {"get_skill": 7, "dispatch": 13, "results": 12}  # results: two agents merged in 3
HANDOFF = 13  # the dependency's report (stored with its end) → the dependent's first request
HANDOFF_COMMITS = 2  # the report with the end, then the dependent's claim
DISPATCH = 17  # the orchestrator's dispatch answer → its first agent's first request
DISPATCH_COMMITS = 3  # the answer, the dispatches created (the turn's read once), the agent's claim
# On a worker's runner, work that becomes ready there is claimed by the transaction that
# made it ready (lifecycle.agents_deliver, orchestrator_wake_if_ready): no claim of its own.
RUNNER_DISPATCH = 9  # the dispatch answer's transaction: 7, and the claim's UPDATE and events (counted calls in 1)
RUNNER_HANDOFF = 9  # the report with its end (7), and the dependent's claim's UPDATE and event
RUNNER_WAKE = 7  # the last report with its end: the UPDATE that wakes the orchestrator claims it


class Segments:
    """The statements and commits between the model requests, by who asked next."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.lock = threading.Lock()
        self.segments: list[dict] = [{"who": "start", "sql": [], "commits": 0}]

    def respond(self, request: dict):
        names = {tool["function"]["name"] for tool in request.get("tools", [])}
        who = f"agent:{agent_of(request)}" if "use_skill" in names else "orchestrator"
        with self.lock:
            self.segments.append({"who": who, "sql": [], "commits": 0})
        return self.plan(request)

    def statement(self, execute, sql, params, many, context):
        self.note(sql)
        return execute(sql, params, many, context)

    def note(self, sql: str) -> None:
        if not CONTROL.match(sql) and not NOT_THE_STEPS.search(sql):
            self.segments[-1]["sql"].append(sql)

    def commit(self, commit):
        def counted(*args):
            self.segments[-1]["commits"] += 1
            return commit(*args)
        return counted

    def before(self, who: str) -> list[dict]:
        """The segments that end in a request by `who` (what ran before it was asked)."""
        return [self.segments[i] for i in range(len(self.segments) - 1) if self.segments[i + 1]["who"] == who]


@pytest.fixture
def measure(llm, inline_tasks, alice, monkeypatch):
    def run(plan: Plan) -> Segments:
        spend_periods_start(user=alice, now=timezone.now())  # a day's and a month's first call are not steps
        segments = Segments(plan)
        llm.respond = segments.respond
        monkeypatch.setattr(connection, "commit", segments.commit(connection.commit))
        with connection.execute_wrapper(segments.statement):
            turn = turn_start(conversation=conversation_for(alice), text="count statements")
        turn.refresh_from_db()
        assert turn.status == "completed", turn.error
        return segments

    return run


class Transactions:
    """The statements of each transaction committed, on whichever thread (a statement
    outside one is a transaction of its own)."""

    def __init__(self):
        self.open: dict[int, list[str]] = {}
        self.committed: list[list[str]] = []

    def note(self, db, sql: str) -> None:
        if CONTROL.match(sql) or NOT_THE_STEPS.search(sql):
            return
        if db.in_atomic_block:
            self.open.setdefault(threading.get_ident(), []).append(sql)
        else:
            self.committed.append([sql])

    def commit(self, commit):
        def counted(db):
            self.committed.append(self.open.pop(threading.get_ident(), []))
            return commit(db)
        return counted

    def having(self, pattern: re.Pattern) -> list[list[str]]:
        return [sql for sql in self.committed if any(pattern.search(one) for one in sql)]


@pytest.fixture
def on_runner(llm, alice, monkeypatch, settings):
    """Run a turn with its work on a real runner in this process, as a qcluster worker
    runs it (its database threads, each with its connection), and every transaction
    committed on any thread recorded."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 1}  # no other process to share with
    runner = Runner(capacity=8, db_threads=2, skill_threads=1)
    monkeypatch.setattr(runner_module, "_runner", runner)

    def run(plan: Plan) -> Transactions:
        spend_periods_start(user=alice, now=timezone.now())
        transactions = Transactions()
        llm.respond = plan
        execute = CursorWrapper._execute_with_wrappers

        def noted(cursor, sql, params, many, executor):
            transactions.note(cursor.db, sql)
            return execute(cursor, sql, params, many, executor)

        monkeypatch.setattr(CursorWrapper, "_execute_with_wrappers", noted)
        wrapper = type(connections["default"])
        monkeypatch.setattr(wrapper, "commit", transactions.commit(wrapper.commit))
        turn = turn_start(conversation=conversation_for(alice), text="count statements")
        deadline = time.monotonic() + 30
        while Turn.objects.get(pk=turn.pk).status != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
        turn.refresh_from_db()
        assert turn.status == "completed", (turn.status, turn.error)
        return transactions

    yield run
    runner.drain(finish_within=5, call_within=1)


def shown(segment: dict) -> str:
    return "\n".join(re.sub(r"\s+", " ", sql)[:160] for sql in segment["sql"])


def test_a_sub_agent_step_is_one_transaction_of_four_statements(measure):
    segments = measure(Plan([Agent("a", ["tasks.search"], [SEARCH] * 4, report="a done")], answer="done"))
    # Before a's 2nd to 5th requests: a step that stored an answer and ran its call. The
    # first of them also reads the skill's circuits, which the process then remembers.
    first, *steady = segments.before("agent:a")[1:]
    assert len(first["sql"]) == AGENT_STEP + 1 and len(steady) == 3, shown(first)
    for segment in steady:
        assert len(segment["sql"]) == AGENT_STEP, shown(segment)
        assert segment["commits"] == AGENT_STEP_COMMITS, shown(segment)


def test_the_orchestrators_steps_and_a_hand_off_keep_their_budgets(measure):
    segments = measure(Plan([Agent("a", ["tasks.search"], [SEARCH], report="a done"),
                             Agent("b", ["tasks.search"], [SEARCH], depends_on=["a"], report="b done")],
                            answer="done"))
    orchestrator = segments.before("orchestrator")
    # Its 2nd request follows get_skill, its 3rd the dispatch, its 4th the results (inline,
    # the agents ran in between: both are merged in that step).
    for name, segment in zip(ORCHESTRATOR_STEPS, orchestrator[1:]):
        assert len(segment["sql"]) <= ORCHESTRATOR_STEPS[name], f"{name}:\n{shown(segment)}"
    (handoff,) = _between(segments, "agent:a", "agent:b")
    assert len(handoff["sql"]) <= HANDOFF, shown(handoff)
    assert handoff["commits"] == HANDOFF_COMMITS, shown(handoff)
    (dispatch,) = _between(segments, "orchestrator", "agent:a")
    assert len(dispatch["sql"]) <= DISPATCH, shown(dispatch)
    assert dispatch["commits"] == DISPATCH_COMMITS, shown(dispatch)


def _between(segments: Segments, asked: str, then: str) -> list[dict]:
    """The segments that `asked`'s answer began and `then`'s request ended."""
    return [segments.segments[i] for i in range(len(segments.segments) - 1)
            if segments.segments[i]["who"] == asked and segments.segments[i + 1]["who"] == then]


CREATED = re.compile(r'^INSERT INTO "orchestration_agentdispatch"')
STARTED = re.compile(r'^UPDATE "orchestration_agentdispatch" SET "state" = %s, "\w+" = CASE')  # agents_start
ENDED = re.compile(r'^UPDATE "orchestration_agentdispatch" SET "state" = %s, "outcome" = %s')  # _finish
WOKEN = re.compile(r'^UPDATE "orchestration_turn" SET "status" = %s, "lease_token" = %s')  # claimed as it wakes
TURN_CLAIMED = re.compile(r'^UPDATE "orchestration_turn" SET "lease_token" = %s')  # Orchestrator.claim


def test_on_a_runner_work_made_ready_there_is_claimed_by_the_transaction_that_made_it_ready(on_runner):
    """A dispatch answer's agents, a dependency's dependent and the orchestrator its last
    agent wakes begin on the runner that made them ready, each claimed in that
    transaction: no claim of its own, a commit less in each hand-off than through the
    queue (the inline budgets above)."""
    transactions = on_runner(Plan([Agent("a", ["tasks.search"], [SEARCH], report="a done"),
                                   Agent("b", ["tasks.search"], [SEARCH], depends_on=["a"], report="b done")],
                                  answer="done"))
    (dispatched,) = transactions.having(CREATED)
    (a_ended, b_ended) = transactions.having(ENDED)
    assert transactions.having(STARTED) == [dispatched, a_ended], "a claim in a transaction of its own"
    assert transactions.having(WOKEN) == [b_ended]
    assert len(transactions.having(TURN_CLAIMED)) == 1  # its first delivery, from the web's turn start
    for name, sql, budget in [("dispatch", dispatched, RUNNER_DISPATCH), ("hand-off", a_ended, RUNNER_HANDOFF),
                              ("wake", b_ended, RUNNER_WAKE)]:
        assert len(sql) <= budget, f"{name}:\n" + "\n".join(re.sub(r"\s+", " ", one)[:160] for one in sql)
