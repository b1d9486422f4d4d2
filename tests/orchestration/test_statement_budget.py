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

import pytest
from django.db import connection
from django.utils import timezone

from orchestration.budgets.spending import spend_periods_start
from orchestration.lifecycle.turns import turn_start
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
        if not CONTROL.match(sql) and not NOT_THE_STEPS.search(sql):
            self.segments[-1]["sql"].append(sql)
        return execute(sql, params, many, context)

    def commit(self, commit):
        def counted():
            self.segments[-1]["commits"] += 1
            return commit()
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
