"""The sub-agent lifecycle as a state machine (DESIGN.md §4), explored by hypothesis.

Workers claim a dispatch, crash (lose their token) or outlive their lease as zombies
holding a stale token; the reaper re-queues or dead-letters after the clock passes the
lease; the broker delivers twice; workers finish, fail, pause, run and replay skill
calls; the owner cancels, the scheduler skips, the orchestrator merges and the turn
ends. The real engine functions run against the real database; after every step the
invariants hold:

- every change of state is one the design allows (DESIGN.md §4 and seed 003:
  created → running → waiting_for_merge → completed | failed → closed, skipped and
  cancelled straight on to closed), each one observed as the engine makes it;
- at most one live lease: a lease token exists exactly while the dispatch is running,
  and only the worker holding the current token can move it on;
- terminal states never change: closed stays closed, an outcome once set stays;
- each side-effect key (dispatch, tool_call_id) runs at most once: one Task row and one
  execution row per key, however often it is replayed;
- each dispatch's agent events follow §4: created, started, attempt*, then
  waiting_for_merge or failed, then closed.

Rows are committed (transactional_db), so each example makes its own conversation,
turn and dispatch in `initialize` and closes them in `teardown`.
"""

from __future__ import annotations

import re
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from orchestration.lifecycle import dispatches as lifecycle
from orchestration.budgets.budget import reserve_skill_call
from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, Event, SkillExecution, TurnStatus
from orchestration.lifecycle.reaper import reap_expired
from orchestration.records.events import event_record
from orchestration.engine.agent import Agent, _finish
from orchestration.llm import Usage
from skills.domains.tasks.models import Task
from skills.executor import execute_skill
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = 3
OUTCOMES = st.sampled_from([DispatchOutcome.COMPLETED, DispatchOutcome.BUDGET_EXCEEDED,
                            DispatchOutcome.FAILED, DispatchOutcome.TIMEOUT])
TRANSITIONS = {  # the design's table, not the engine's
    ("created", "running"), ("running", "created"),  # claim; pause, a wait, or reaped for redelivery
    ("running", "waiting_for_merge"), ("running", "failed"),  # finished; failed or dead-lettered
    ("waiting_for_merge", "completed"), ("completed", "closed"), ("failed", "closed"),  # merged
    ("created", "skipped"), ("skipped", "closed"),  # a dependency did not succeed
    ("created", "cancelled"), ("running", "cancelled"), ("cancelled", "closed"),  # stopped
}
EVENT_ORDER = re.compile(
    r"^created( started( attempt)*( (waiting_for_merge|failed))?)?( closed)?$"
)


def claim_token(dispatch_id: int) -> str | None:
    """The lease token a delivery's claim took, or None when it took none."""
    claimed = Agent.claim(dispatch_id)
    return claimed.token if claimed else None


class DispatchLifecycle(RuleBasedStateMachine):
    user = None  # set by the test: the fixture's user

    transitions: list = []  # set by the test: every (from, to) the engine made

    @initialize()
    def create_rows(self):
        self.transitions.clear()
        self.turn = turn_for(conversation_for(self.user), status=TurnStatus.RUNNING)
        dispatch = dispatch_for(self.turn, "agent", skills=["tasks.create"])
        event_record(type="agent.subagent_created", dispatch=dispatch, summary="agent created")
        self.pk = dispatch.pk
        self.held: list[str] = []  # the tokens workers hold: the live one, and zombies'
        self.ran: set[int] = set()  # side-effect keys that ran
        self.seen = self.snapshot()

    def teardown(self):
        # Nothing of this example may stay claimable or reapable for the next one.
        lifecycle.dispatch_cancel(self.dispatch(), reason="example over")
        type(self.turn).objects.filter(pk=self.turn.pk).update(status=TurnStatus.STOPPED)

    # --- helpers ---------------------------------------------------------------------

    def dispatch(self) -> AgentDispatch:
        return AgentDispatch.objects.select_related("turn__conversation").get(pk=self.pk)

    def snapshot(self) -> tuple[str, str, str]:
        return AgentDispatch.objects.values_list("state", "outcome", "lease_token").get(pk=self.pk)

    def live(self) -> str:
        return self.snapshot()[2]

    def has_zombie(self) -> bool:
        return any(token != self.live() for token in self.held)

    def title(self, key: int) -> str:
        return f"side effect {self.pk}/{key}"

    # --- deliveries, crashes and the reaper -------------------------------------------

    @rule()
    def claim(self):
        before = self.snapshot()
        token = claim_token(self.pk)
        assert (token is not None) == (before[0] == DispatchState.CREATED)
        if token:
            self.held.append(token)
            assert self.snapshot() == (DispatchState.RUNNING, before[1], token)

    @rule()
    def duplicate_delivery(self):
        """The broker hands the same task out twice: only one delivery may claim it."""
        tokens = [token for token in (claim_token(self.pk), claim_token(self.pk)) if token]
        assert len(tokens) <= 1
        self.held.extend(tokens)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def crash(self, data):
        """A worker dies: its token is gone, its lease stays until it expires."""
        self.held.remove(data.draw(st.sampled_from(self.held)))

    @rule(redeliver=st.booleans())
    def lease_expires_and_reaper_runs(self, redeliver):
        """The clock passes the lease (the worker died, or is slow: a zombie with its old
        token); the reaper re-queues or dead-letters, and maybe the re-queued task runs."""
        before = self.dispatch()
        later = timezone.now() + timedelta(seconds=django_settings.ASSISTANT_LEASE_SECONDS + 1)
        with mock.patch("django.utils.timezone.now", return_value=later):
            reap_expired()
        if before.state == DispatchState.RUNNING:
            state, _, token = self.snapshot()
            assert token == ""
            dead = before.crashes + 1 >= django_settings.ASSISTANT_MAX_STEP_ATTEMPTS
            assert state == (DispatchState.FAILED if dead else DispatchState.CREATED)
        if redeliver:
            self.claim()

    # --- workers moving the dispatch on -------------------------------------------------

    def worker_finishes(self, token: str, outcome: str):
        before = self.snapshot()
        error = "" if outcome in lifecycle.SUCCESS_OUTCOMES else "boom"
        _finish(self.dispatch(), token, outcome=outcome, result="report", error=error, progress={}, usage=Usage())
        after = self.snapshot()
        if before[0] == DispatchState.RUNNING and before[2] == token:
            ok = outcome in lifecycle.SUCCESS_OUTCOMES
            assert after == (DispatchState.WAITING_FOR_MERGE if ok else DispatchState.FAILED, outcome, "")
        else:
            assert after == before  # a stale token changes nothing

    @precondition(lambda self: self.live() in self.held)
    @rule(outcome=OUTCOMES)
    def live_worker_finishes(self, outcome):
        self.worker_finishes(self.live(), outcome)

    @precondition(lambda self: self.has_zombie())
    @rule(data=st.data(), outcome=OUTCOMES)
    def zombie_finishes(self, data, outcome):
        self.worker_finishes(data.draw(st.sampled_from([t for t in self.held if t != self.live()])), outcome)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def worker_pauses(self, data):
        """The turn paused: the worker hands its dispatch back to `created`."""
        token = data.draw(st.sampled_from(self.held))
        before = self.snapshot()
        lifecycle.agent_give_back(self.pk, token)
        if before[0] == DispatchState.RUNNING and before[2] == token:
            assert self.snapshot() == (DispatchState.CREATED, before[1], "")
        else:
            assert self.snapshot() == before

    @rule(key=st.integers(0, KEYS - 1))
    def run_skill(self, key):
        """A worker, live or zombie, runs the call with this tool_call_id (a replay if it
        ran before): the side effect happens at most once."""
        dispatch = self.dispatch()
        arguments = {"title": self.title(key)}
        outcome = execute_skill(
            name="tasks.create", arguments=arguments, user=self.user, tool_call_id=f"call-{key}",
            scope={"dispatch": dispatch}, granted=dispatch.skills,
            before_run=lambda *_: reserve_skill_call(dispatch=dispatch, skill="tasks.create", arguments=arguments),
        )
        assert outcome.ok, outcome.error
        assert outcome.replayed == (key in self.ran)
        self.ran.add(key)

    @precondition(lambda self: self.ran)
    @rule(data=st.data())
    def replay_skill(self, data):
        self.run_skill(data.draw(st.sampled_from(sorted(self.ran))))

    # --- the owner and the orchestrator ------------------------------------------------

    @rule()
    def cancel(self):
        before = self.snapshot()
        closed = lifecycle.dispatch_cancel(self.dispatch(), reason="cancelled")
        assert closed == (before[0] in (DispatchState.CREATED, DispatchState.RUNNING))
        if closed:
            assert self.snapshot() == (DispatchState.CLOSED, DispatchOutcome.CANCELLED, "")

    @rule()
    def skip(self):
        before = self.snapshot()
        skipped = lifecycle.dispatch_skip(self.dispatch(), reason="dependency x failed")
        assert skipped == (before[0] == DispatchState.CREATED)
        if skipped:
            assert self.snapshot() == (DispatchState.CLOSED, DispatchOutcome.SKIPPED, "")

    @rule()
    def merge(self):
        before = self.snapshot()
        lifecycle.dispatch_merge(self.dispatch())
        if before[0] in (DispatchState.WAITING_FOR_MERGE, DispatchState.FAILED):
            assert self.snapshot() == (DispatchState.CLOSED, before[1], "")
        else:
            assert self.snapshot() == before

    @rule()
    def turn_ends(self):
        """However the turn ends (answered, failed, stopped), the dispatch is closed."""
        lifecycle.turn_dispatches_close(self.turn, reason="the turn ended")
        assert self.snapshot()[0] == DispatchState.CLOSED

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def every_transition_is_the_designs(self):
        assert set(self.transitions) <= TRANSITIONS, set(self.transitions) - TRANSITIONS

    @invariant()
    def one_live_lease_and_terminal_states_stay(self):
        state, outcome, token = now = self.snapshot()
        assert bool(token) == (state == DispatchState.RUNNING), now
        assert self.held.count(token) <= 1 if token else True
        before = self.seen
        if before != now:
            assert before[0] != DispatchState.CLOSED, (before, now)
            assert not before[1] or before[1] == outcome, (before, now)
        self.seen = now

    @invariant()
    def side_effects_at_most_once(self):
        for key in range(KEYS):
            ran = int(key in self.ran)
            assert Task.objects.filter(title=self.title(key)).count() == ran
            assert SkillExecution.objects.filter(dispatch_id=self.pk, tool_call_id=f"call-{key}").count() == ran

    @invariant()
    def agent_events_in_order(self):
        types = Event.objects.filter(dispatch_id=self.pk, type__startswith="agent.subagent_").order_by("id")
        trail = " ".join(t.removeprefix("agent.subagent_") for t in types.values_list("type", flat=True))
        assert EVENT_ORDER.match(trail), trail


@pytest.fixture
def no_queue(monkeypatch):
    """Whatever the reaper or the scheduler enqueues is dropped: the machine is the worker."""
    monkeypatch.setattr("orchestration.delivery.queue.async_task", lambda *args, **kwargs: None)


@pytest.fixture
def transitions(monkeypatch):
    """Every state change the engine makes, as (from, to): all go through `transition`."""
    made: list[tuple[str, str]] = []
    real = lifecycle.transition

    def observed(dispatch_id, *, target, **kwargs):
        before = AgentDispatch.objects.values_list("state", flat=True).get(pk=dispatch_id)
        moved = real(dispatch_id, target=target, **kwargs)
        if moved:
            made.append((before, target))
        return moved

    monkeypatch.setattr(lifecycle, "transition", observed)
    return made


def test_dispatch_lifecycle(no_queue, transitions, alice):
    machine = type("Machine", (DispatchLifecycle,), {"user": alice, "transitions": transitions})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=30, stateful_step_count=15, deadline=None, database=None)
    )
