"""The step machine under random interleavings (issue 25), explored by hypothesis.

Real turns run through the real engine (engine/loop.py and its two roles), the real
openai SDK against the scripted server, on the test database. Tasks go to a list, as
django-q2 would hold them; the machine is the one worker, and its rules decide what
happens next:

- deliver the next task (and maybe deliver it again later: the broker's duplicate), or
  deliver it with a fault at a random point of the delivery — the points are every
  step the loop hands to the runner's threads (`runner.db`, `runner.skills`) and the
  model call, before and after each:
  - crash: the worker dies there (WorkerDied, a BaseException nothing in the engine
    catches; whatever the delivery would have run afterwards never runs), its lease
    left held;
  - transient: the next database query raises OperationalError with SQLSTATE 40001 (a
    serialization failure: the statement, and the transaction it is in, roll back);
  - stall: the worker is slow past its lease (a slow skill, a hung call): the clock
    moves on past the lease and the reaper runs, then the worker goes on;
  - stop: the owner presses Stop right there;
- the owner presses Continue on a paused turn, approves or denies the call an approval
  shows (with the id and digest shown; now and then a stale digest, which must change
  nothing), or presses Stop;
- the reaper runs, with or without the clock moved past the lease.

The script: an orchestrator dispatches one to three agents at once (a later one may
depend on the one before; one may delegate to a child of its own), asks for their
results and answers. Each agent makes one to three skill calls, one a step: tasks.create
with a title of its own (side effects countable), or email.send, which asks the owner
first. The turn's limits are small (skill calls, agents' model calls, orchestrator
iterations) and so are Continue's grants, so pauses come often.

After every rule:
- no lease is held but by a worker the machine killed (a crashed delivery): nothing a
  delivery, a pause, a Continue, an approval or a hand-back does leaves one;
- crashes are counted only for expired leases (AgentDispatch.crashes, Turn.crashes
  equal the leases the reaper found expired), never for pauses, Continues, approvals
  or hand-backs; dead-lettered exactly at ASSISTANT_MAX_STEP_ATTEMPTS crashes;
- no skill call runs twice (each task title at most once, each mail subject at most
  once, each SkillExecution key once);
- no model answer is paid for twice except across a fault: the scripted server's
  requests, keyed (agent, step) as the engine keys its LLMCall rows, are never asked
  again once stored, and asked again only when the delivery that asked before was hit
  by a crash, a transient error or a stall after asking;
- a transient database error never becomes a failure anyone sees.

At the end the rules stop and the owner answers every question (Continue, approve; Stop
only if Continue is refused), tasks are delivered and the reaper runs with the clock
moved on, until the turn ends (bounded). Then: the turn ended (completed, unless the
machine stopped it or a worker was dead-lettered); every agent is closed with an
outcome and a reason (run, skipped or cancelled; a refused dispatch has none and was
answered with an error); every completed agent's side effects happened exactly once.

STEP_MACHINE_EXAMPLES (default 12) sets the number of examples: each is a couple of
seconds of real turns, and `make test` runs it twice (SQLite, then PostgreSQL), so the
default is what CI's time allows; STEP_MACHINE_EXAMPLES=200 for a thorough run.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import OperationalError, connection
from django.utils import timezone
from django.utils.module_loading import import_string
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from orchestration.delivery import runner
from orchestration.engine import loop
from orchestration.engine.agent import Agent, _key
from orchestration.engine.orchestrator import Orchestrator
from orchestration.lifecycle.reaper import reap_expired
from orchestration.lifecycle.turns import TurnRefused, turn_start, turn_stop
from orchestration.models import (
    AgentDispatch,
    AgentProfile,
    DispatchState,
    LLMCall,
    Message,
    SkillApproval,
    SkillExecution,
    Turn,
    TurnPause,
    TurnStatus,
)
from orchestration.questions.approvals import StaleAnswer, approval_answer
from orchestration.questions.pauses import APPROVAL, turn_continue
from skills.domains.email.models import OutboxEmail
from skills.domains.tasks.models import Task
from tests.factories import conversation_for
from tests.support.llm_server import Reply, agent_of, calls, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals_on")]

EXAMPLES = int(os.environ.get("STEP_MACHINE_EXAMPLES", "12"))
SKILLS = ["tasks.create", "email.send"]
STRANGER = "carol@elsewhere.example"  # email.send asks first (the policy, and a new recipient)
FAULTS = ("crash", "transient", "stall", "stop")
END_ROUNDS = 400


class WorkerDied(BaseException):
    """The worker process died here: nothing after this point of the delivery runs."""


class SerializationFailure(Exception):
    """What a driver raises for SQLSTATE 40001 (the OperationalError's __cause__)."""

    sqlstate = "40001"


# --- the scripted model ----------------------------------------------------------------------


@dataclass
class Scripted:
    agent_id: str
    actions: list = field(default_factory=list)  # "task" | "mail" | ("delegate", Scripted)
    depends_on: list[str] = field(default_factory=list)
    lead: bool = False

    def steps(self) -> list[tuple]:
        out = []
        for index, action in enumerate(self.actions):
            if isinstance(action, tuple):
                out += [("dispatch", action[1]), ("results", None)]
            else:
                out.append((action, f"{self.agent_id}#{index}"))
        return out

    def titles(self) -> list[str]:
        return [name for action, name in self.steps() if action == "task"]

    def subjects(self) -> list[str]:
        return [name for action, name in self.steps() if action == "mail"]


def spec(agent: Scripted) -> dict:
    out = {"agent_id": agent.agent_id, "mission": f"mission:{agent.agent_id}", "skills": SKILLS}
    if agent.depends_on:
        out["depends_on"] = agent.depends_on
    if agent.lead:
        out["profile"] = "lead"
    return out


class Model:
    """Answers from the request alone (a replay is answered alike); logs each request
    under the key the engine stores its answer by: (agent, step) or ("orchestrator", step),
    the step being the assistant messages the request carries."""

    def __init__(self, top: list[Scripted], ledger: Ledger):
        self.top, self.ledger = top, ledger
        self.agents: dict[str, Scripted] = {}
        stack = list(top)
        while stack:
            agent = stack.pop()
            self.agents[agent.agent_id] = agent
            stack += [action[1] for action in agent.actions if isinstance(action, tuple)]

    def __call__(self, request: dict) -> Reply:
        messages = request["messages"]
        step = sum(1 for m in messages if m["role"] == "assistant")
        if "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}:
            agent_id = agent_of(request)
            self.ledger.add("request", (agent_id, step))
            return self.agent_reply(self.agents[agent_id], step)
        self.ledger.add("request", ("orchestrator", step))
        if step == 0:
            return calls(*[("dispatch_agent", spec(agent)) for agent in self.top])
        if step == 1:
            return calls(("get_agent_results", {}))
        return text("All done.")

    @staticmethod
    def agent_reply(agent: Scripted, step: int) -> Reply:
        steps = agent.steps()
        if step >= len(steps):
            return text(f"{agent.agent_id} done.")
        action, what = steps[step]
        if action == "dispatch":
            return calls(("dispatch_agent", spec(what)))
        if action == "results":
            return calls(("get_agent_results", {}))
        if action == "task":
            arguments = {"skill": "tasks.create", "arguments": {"title": what}}
        else:
            arguments = {"skill": "email.send", "arguments": {"to": [STRANGER], "subject": what, "body": "Hello."}}
        return calls(("use_skill", arguments))


class Ledger:
    """What happened, in order: requests to the model, answers stored, faults fired;
    each with the delivery it happened in."""

    def __init__(self):
        self.entries: list[tuple[str, object, int]] = []
        self.delivery = 0
        self._lock = threading.Lock()

    def add(self, kind: str, what) -> None:
        with self._lock:
            self.entries.append((kind, what, self.delivery))

    def check(self) -> None:
        """No answer asked for again once stored; asked again only if a fault hit the
        delivery that asked for it before (a crash or a transient error after it asked, or
        a stall that took its lease away before it stored the answer)."""
        asked: dict = {}
        stored: set = set()
        for index, (kind, what, delivery) in enumerate(self.entries):
            if kind == "request":
                assert what not in stored, f"the answer for {what} was stored, yet asked for again: {self.entries}"
                if what in asked:
                    before, in_delivery = asked[what]
                    assert any(k == "fault" and d == in_delivery for k, _, d in self.entries), (
                        f"{what} paid for twice, with no fault in the delivery that asked first: {self.entries}")
                asked[what] = (index, delivery)
            elif kind == "stored":
                assert what in asked, f"stored {what}, never asked for: the keys disagree: {self.entries}"
                stored.add(what)

    def stored(self) -> set:
        return {what for kind, what, _ in self.entries if kind == "stored"}


# --- the machine ------------------------------------------------------------------------------

plans = st.lists(st.sampled_from(["task", "mail"]), min_size=1, max_size=3)
scenarios = st.fixed_dictionaries({
    "agents": st.lists(st.tuples(plans, st.booleans(), st.none() | plans), min_size=1, max_size=3),
    "limits": st.fixed_dictionaries({
        "turn_max_skill_calls": st.integers(1, 4),
        "turn_max_llm_calls": st.integers(2, 6),
        "turn_max_llm_iterations": st.integers(2, 4),
    }),
})
_examples = itertools.count()
STATISTICS: Counter = Counter()  # what the examples did, printed at the end (pytest -s)


def event(what: str) -> None:
    STATISTICS[what] += 1


def guarded(method):
    """A rule or an invariant: the end is checked only if every one of them finished
    (a failure is reported as it is, not as whatever a run to the end makes of it)."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        self.finished_rule = False
        result = method(self, *args, **kwargs)
        self.finished_rule = True
        return result

    return wrapped


class StepMachine(RuleBasedStateMachine):
    # set by the test
    llm = None
    settings = None
    tasks: list = []
    clock: dict = {}

    def __init__(self):
        super().__init__()
        self.turn_pk = None
        self.finished_rule = True

    # --- setting up -------------------------------------------------------------------------

    @initialize(scenario=scenarios)
    def start(self, scenario):
        n = next(_examples)
        self.tasks.clear()
        self.ledger = Ledger()
        self.settings.ASSISTANT_LIMITS = {**self.settings.ASSISTANT_LIMITS, **scenario["limits"],
                                          "turn_max_continues": 100, "agent_timeout_seconds": 10_000_000.0}
        top = []
        for index, (actions, depends, child) in enumerate(scenario["agents"]):
            agent_id = f"x{n}a{index}"
            actions = list(actions)
            if child is not None:
                actions.insert(1, ("delegate", Scripted(f"{agent_id}c", list(child))))
            top.append(Scripted(agent_id, actions, depends_on=[top[-1].agent_id] if index and depends else [],
                                lead=child is not None))
        self.model = Model(top, self.ledger)
        self.llm.respond = self.model
        self.user = get_user_model().objects.create_user(username=f"owner{n}", email="owner@example.com")
        turn = turn_start(conversation=conversation_for(self.user), text=f"example {n}")
        self.turn_pk = turn.pk
        self.orphans: set = set()  # leases of workers the machine killed
        self.expected: Counter = Counter()  # ("agent"|"turn", pk) -> expired leases the reaper found
        self.stopped = False  # the machine pressed Stop (or Continue was refused)
        self.injection = None
        self.quiet = False
        self.mail_before = len(mail.outbox)

    def teardown(self):
        if self.turn_pk is None:
            return
        try:
            if self.finished_rule:
                self.run_to_the_end()
                self.check_the_end()
        finally:
            turn = Turn.objects.get(pk=self.turn_pk)
            if turn.is_active:
                turn_stop(turn=turn, user=self.user)
            self.tasks.clear()

    # --- helpers ----------------------------------------------------------------------------

    def turn(self) -> Turn:
        return Turn.objects.select_related("conversation").get(pk=self.turn_pk)

    def held(self) -> set:
        agents = AgentDispatch.objects.filter(turn_id=self.turn_pk).exclude(lease_token="")
        held = {("agent", pk, token) for pk, token in agents.values_list("pk", "lease_token")}
        turns = Turn.objects.filter(pk=self.turn_pk).exclude(lease_token="")
        return held | {("turn", pk, token) for pk, token in turns.values_list("pk", "lease_token")}

    def advance(self) -> None:
        """The clock moves on past every lease held now."""
        self.clock["offset"] += timedelta(seconds=self.settings.ASSISTANT_LEASE_SECONDS + 1)

    def reap(self, *, advance: bool) -> None:
        """The reaper; every lease it takes away counts as one crash of its work."""
        if advance:
            self.advance()
        before = self.held()
        reap_expired()
        for kind, pk, _ in before - self.held():
            self.expected[(kind, pk)] += 1

    def pause(self) -> TurnPause | None:
        return TurnPause.objects.filter(turn_id=self.turn_pk, decision="").first()

    def approval(self) -> SkillApproval | None:
        return SkillApproval.objects.filter(pause__turn_id=self.turn_pk, pause__decision="",
                                            pause__limit=APPROVAL).first()

    def stop(self) -> None:
        try:
            turn_stop(turn=self.turn(), user=self.user)
            self.stopped = True
        except TurnRefused:
            pass

    # --- the worker, and what can happen to it ------------------------------------------------

    def deliver(self, fault: str | None = None, at: int = 0, query: int = 1) -> None:
        func, args = self.tasks.pop(0)
        self.ledger.delivery += 1
        self.injection = {"fault": fault, "at": at, "points": 0, "dead": False, "armed": 0, "query": query}
        died = False
        try:
            with connection.execute_wrapper(self.failing_query):
                import_string(func)(*args)
        except WorkerDied:
            died = True
        finally:
            self.injection = None
        if died:
            self.orphans |= self.held()  # its lease, if it held one, stays until it expires

    async def point(self, where: str) -> None:
        """A point of the delivery between two of its steps: the armed fault fires here."""
        injection = self.injection
        if injection is None:
            return
        if injection["dead"]:
            raise WorkerDied(where)
        injection["points"] += 1
        if injection["fault"] is None or injection["points"] != injection["at"]:
            return
        fault, injection["fault"] = injection["fault"], None
        if fault == "crash":
            self.ledger.add("fault", f"crash {where}")
            injection["dead"] = True
            raise WorkerDied(where)
        if fault == "transient":
            injection["armed"] = injection["query"]  # that query from here fails (logged when it does)
            injection["where"] = where
        elif fault == "stall":
            self.ledger.add("fault", f"stall {where}")
            await REAL["db"](self.quietly, lambda: self.reap(advance=True))
        elif fault == "stop":
            await REAL["db"](self.quietly, self.stop)

    def quietly(self, fn):
        self.quiet = True
        try:
            return fn()
        finally:
            self.quiet = False

    def failing_query(self, execute, sql, params, many, context):
        injection = self.injection
        if injection is not None and injection["armed"] and not self.quiet:
            injection["armed"] -= 1
            if injection["armed"] == 0:
                self.ledger.add("fault", f"transient {injection['where']}: {sql[:40]}")
                raise OperationalError("could not serialize access due to concurrent update") from SerializationFailure()
        return execute(sql, params, many, context)

    # --- rules ------------------------------------------------------------------------------

    @precondition(lambda self: self.tasks)
    @rule(again=st.sampled_from([False, False, False, True]))
    @guarded
    def deliver_next(self, again):
        """The next task; `again`: the broker will deliver it a second time, later."""
        task = self.tasks[0]
        self.deliver()
        if again:
            self.tasks.append(task)

    @precondition(lambda self: self.tasks)
    @rule()
    @guarded
    def deliver_next_plainly(self):  # (plain deliveries twice as likely as faulty ones)
        self.deliver_next(again=False)

    @precondition(lambda self: self.tasks)
    @rule(fault=st.sampled_from(["crash", "crash", "transient", "transient", "stall", "stop"]),
          at=st.integers(1, 14), query=st.integers(1, 8))
    @guarded
    def deliver_next_with_a_fault(self, fault, at, query):
        """The next task, with `fault` at the delivery's point `at` (if it gets that far);
        a transient error fails the `query`th query from there."""
        self.deliver(fault, at, query)
        if fault == "stop" and self.turn().status == TurnStatus.STOPPED:
            self.stopped = True

    @precondition(lambda self: self.turn_pk and self.pause() is not None and self.approval() is None)
    @rule()
    @guarded
    def press_continue(self):
        try:
            turn_continue(turn=self.turn(), user=self.user)
        except TurnRefused:  # no Continue left: Stop is
            self.stop()

    @precondition(lambda self: self.turn_pk and self.approval() is not None)
    @rule(approve=st.booleans(), stale=st.sampled_from([False, False, False, True]))
    @guarded
    def answer_approval(self, approve, stale):
        asked = self.approval()
        digest = asked.digest if not stale else "0" * 64
        try:
            approval_answer(turn=self.turn(), user=self.user, approval_id=asked.pk, digest=digest, approve=approve)
            assert not stale
        except StaleAnswer:
            assert stale
            assert self.approval() == asked and self.turn().status == TurnStatus.PAUSED

    @rule(go=st.integers(0, 19))
    @guarded
    def press_stop(self, go):
        """The owner's Stop, now and then."""
        if go == 13 and self.turn_pk:
            self.stop()

    @precondition(lambda self: self.turn_pk)
    @rule(advance=st.booleans())
    @guarded
    def reaper_runs(self, advance):
        self.reap(advance=advance)

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    @guarded
    def only_dead_workers_hold_leases(self):
        if self.turn_pk:
            assert self.held() <= self.orphans, (self.held() - self.orphans, self.ledger.entries[-5:])

    @invariant()
    @guarded
    def crashes_are_expired_leases_only(self):
        if not self.turn_pk:
            return
        limit = self.settings.ASSISTANT_MAX_STEP_ATTEMPTS
        for dispatch in AgentDispatch.objects.filter(turn_id=self.turn_pk):
            expected = self.expected[("agent", dispatch.pk)]
            assert dispatch.crashes == expected, (dispatch.agent_id, dispatch.crashes, expected)
            assert ("dead-lettered" in dispatch.error) == (expected >= limit), (dispatch.agent_id, dispatch.error)
        turn = self.turn()
        expected = self.expected[("turn", turn.pk)]
        dead = "dead-lettered" in turn.error
        assert dead == (expected >= limit), (turn.status, turn.error, expected)
        assert turn.crashes == expected, (turn.crashes, expected)

    @invariant()
    @guarded
    def no_side_effect_twice(self):
        if not self.turn_pk:
            return
        titles = [t for a in self.model.agents.values() for t in a.titles()]
        counts = Counter(Task.objects.filter(title__in=titles).values_list("title", flat=True))
        assert all(n == 1 for n in counts.values()), counts
        subjects = [s for a in self.model.agents.values() for s in a.subjects()]
        sent = Counter(m.subject for m in mail.outbox[self.mail_before:])
        assert all(n == 1 for n in sent.values()), sent
        assert set(sent) <= set(subjects)
        rows = Counter(OutboxEmail.objects.filter(subject__in=subjects).values_list("subject", flat=True))
        assert rows == sent, (rows, sent)
        keys = Counter((dispatch, skill, json.dumps(arguments, sort_keys=True)) for dispatch, skill, arguments
                       in SkillExecution.objects.filter(dispatch__turn_id=self.turn_pk)
                       .values_list("dispatch_id", "skill", "arguments"))
        assert all(n == 1 for n in keys.values()), keys

    @invariant()
    @guarded
    def no_answer_paid_twice(self):
        if self.turn_pk:
            self.ledger.check()

    @invariant()
    @guarded
    def transient_errors_are_never_failures(self):
        if not self.turn_pk:
            return
        assert "OperationalError" not in self.turn().error
        for error in AgentDispatch.objects.filter(turn_id=self.turn_pk).values_list("error", flat=True):
            assert "OperationalError" not in error, error
        for error in SkillExecution.objects.filter(dispatch__turn_id=self.turn_pk).values_list("error", flat=True):
            assert "OperationalError" not in error, error

    # --- the end ----------------------------------------------------------------------------

    def run_to_the_end(self) -> None:
        """The owner answers every question; tasks are delivered; the reaper runs with the
        clock moved on when nothing else can happen. Bounded."""
        idle = 0
        for _ in range(END_ROUNDS):
            turn = self.turn()
            if not turn.is_active:
                return
            if self.tasks:
                self.deliver()
                idle = 0
            elif turn.status == TurnStatus.PAUSED:
                if (asked := self.approval()) is not None:
                    approval_answer(turn=turn, user=self.user, approval_id=asked.pk, digest=asked.digest, approve=True)
                else:
                    try:
                        turn_continue(turn=turn, user=self.user)
                    except TurnRefused:
                        self.stop()
            else:
                self.reap(advance=True)
                idle += 1
                assert idle < 3, self.stranded()
            self.only_dead_workers_hold_leases()
            self.crashes_are_expired_leases_only()
        raise AssertionError(f"the turn did not end in {END_ROUNDS} rounds: {self.stranded()}")

    def stranded(self) -> str:
        turn = self.turn()
        dispatches = list(AgentDispatch.objects.filter(turn_id=self.turn_pk).values_list(
            "agent_id", "state", "queued_at", "lease_token", "awaiting"))
        return (f"turn {turn.status} lease={turn.lease_token!r} queued={turn.queued_at} awaiting={turn.awaiting}; "
                f"agents {dispatches}; last: {self.ledger.entries[-8:]}")

    def check_the_end(self) -> None:
        turn = self.turn()
        assert turn.status in (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.STOPPED), turn.status
        if turn.status != TurnStatus.COMPLETED:
            assert self.stopped or "dead-lettered" in turn.error, (turn.status, turn.error)
        for invariant_ in (self.only_dead_workers_hold_leases, self.crashes_are_expired_leases_only,
                           self.no_side_effect_twice, self.no_answer_paid_twice,
                           self.transient_errors_are_never_failures):
            invariant_()
        assert not self.held(), self.held()

        # every agent closed, with an outcome and a reason
        dispatches = {d.agent_id: d for d in AgentDispatch.objects.filter(turn_id=self.turn_pk)}
        for dispatch in dispatches.values():
            assert dispatch.state == DispatchState.CLOSED, (dispatch.agent_id, dispatch.state)
            assert dispatch.outcome in ("completed", "budget_exceeded", "failed", "timeout", "skipped", "cancelled"), (
                dispatch.agent_id, dispatch.outcome)
            assert dispatch.close_reason, dispatch.agent_id
            if dispatch.outcome == "failed":  # nothing fails here but a dead-lettered worker
                assert "dead-lettered" in dispatch.error, (dispatch.agent_id, dispatch.error)
            if dispatch.outcome == "completed":
                agent = self.model.agents[dispatch.agent_id]
                assert Task.objects.filter(title__in=agent.titles()).count() == len(agent.titles()), agent
                approved = SkillApproval.objects.filter(dispatch=dispatch, decision="approved").count()
                sent = [m for m in mail.outbox[self.mail_before:] if m.subject in agent.subjects()]
                assert len(sent) == approved, (agent, approved, len(sent))

        # every dispatch the orchestrator asked for: an agent, or refused with a reason
        if turn.status == TurnStatus.COMPLETED:
            asked = [c for m in turn.messages.filter(role=Message.Role.ASSISTANT) for c in m.tool_calls]
            answers = {m.tool_call_id: m.content for m in turn.messages.filter(role=Message.Role.TOOL)}
            for call in asked:
                assert call["id"] in answers, call
                if call["function"]["name"] == "dispatch_agent":
                    answer = json.loads(answers[call["id"]])
                    agent_id = json.loads(call["function"]["arguments"])["agent_id"]
                    assert answer.get("status") == "dispatched" or answer.get("error"), answer
                    assert (agent_id in dispatches) == (answer.get("status") == "dispatched"), answer
            if not self.stopped:  # cancelled only as the child of a dead-lettered parent
                for dispatch in dispatches.values():
                    parent = dispatch.parent
                    assert dispatch.outcome != "cancelled" or (parent and "dead-lettered" in parent.error), (
                        dispatch.agent_id, dispatch.close_reason, parent and (parent.outcome, parent.error))

        faults = Counter(what.split()[0] for kind, what, _ in self.ledger.entries if kind == "fault")
        for kind, what, _ in self.ledger.entries:
            if kind == "fault":
                event("fault: " + " ".join(what.split(":")[0].split()[:3]))
        event(f"turn {turn.status}" + (" (dead-lettered)" if "dead-lettered" in turn.error else ""))
        for kind, n in faults.items():
            event(f"{kind} faults: {min(n, 3)}{'+' if n >= 3 else ''}")
        event(f"pauses: {min(TurnPause.objects.filter(turn=turn).count(), 5)}")
        event(f"approvals: {SkillApproval.objects.filter(turn=turn).count()}")
        event(f"agents crashed: {sum(1 for (kind, _), n in self.expected.items() if kind == 'agent' and n)}")
        event(f"outcomes: {sorted(Counter(d.outcome for d in dispatches.values()).items())}")

        # every answer stored once, and the ledger and the store agree
        stored = LLMCall.objects.filter(turn_id=self.turn_pk)
        assert stored.count() == len(self.ledger.stored()), (stored.count(), self.ledger.stored())


REAL: dict = {}


@pytest.fixture
def engine_points(monkeypatch):
    """The points of a delivery, and the store of each answer, observed."""
    machine: dict = {}
    REAL["db"], REAL["skills"], REAL["ask"] = runner.db, runner.skills, loop.complete_retrying

    def at_points(real):
        async def wrapped(fn, /, *args, **kwargs):
            name = getattr(fn, "__qualname__", repr(fn))
            await machine["m"].point(f"before {name}")
            result = await real(fn, *args, **kwargs)
            await machine["m"].point(f"after {name}")
            return result

        return wrapped

    async def ask(*args, **kwargs):
        await machine["m"].point("before the model call")
        result = await REAL["ask"](*args, **kwargs)
        await machine["m"].point("after the model call")
        return result

    monkeypatch.setattr(runner, "db", at_points(REAL["db"]))
    monkeypatch.setattr(runner, "skills", at_points(REAL["skills"]))
    monkeypatch.setattr(loop, "complete_retrying", ask)

    def logged_store(real, key_of):
        def store(self, step, response, duration_ms):
            result = real(self, step, response, duration_ms)
            m = machine["m"]
            if m.quietly(lambda: LLMCall.objects.filter(key=key_of(self, step), turn_id=m.turn_pk).exists()):
                m.ledger.add("stored", (self.dispatch.agent_id, step) if isinstance(self, Agent)
                             else ("orchestrator", step))
            return result

        store.__qualname__ = real.__qualname__
        return store

    monkeypatch.setattr(Agent, "store", logged_store(Agent.store, lambda agent, step: _key(agent.dispatch, step)))
    monkeypatch.setattr(Orchestrator, "store", logged_store(Orchestrator.store,
                                                            lambda orch, step: f"orchestrator:{step + 1}"))
    monkeypatch.setattr("orchestration.delivery.dbretry.FIRST_WAIT_SECONDS", 0.001)
    return machine


@pytest.fixture
def shifted_clock(monkeypatch):
    """timezone.now, moved on by the machine (leases expire), never back."""
    clock = {"offset": timedelta(0)}
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + clock["offset"])
    return clock


def test_the_step_machine(llm, settings, engine_points, shifted_clock, monkeypatch):
    tasks: list = []
    monkeypatch.setattr("orchestration.delivery.queue.async_task", lambda func, *args: tasks.append((func, args)))
    AgentProfile.objects.get_or_create(name="lead", defaults={
        "description": "Delegates.", "system_prompt": "You lead.", "may_delegate": True, "max_tool_calls": 5})
    machine_class = type("Machine", (StepMachine,), {"llm": llm, "settings": settings, "tasks": tasks,
                                                     "clock": shifted_clock})

    real_init = machine_class.__init__

    def init(self):
        real_init(self)
        engine_points["m"] = self

    machine_class.__init__ = init
    STATISTICS.clear()
    run_state_machine_as_test(machine_class, settings=settings_for_run())
    assert llm.errors == []
    print("\n".join(f"{n:5d}  {what}" for what, n in sorted(STATISTICS.items())))


def settings_for_run():
    return settings(max_examples=EXAMPLES, stateful_step_count=25, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
