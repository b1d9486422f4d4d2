"""A sub-agent's role in the step machine (engine/loop.py; DESIGN.md §3–4), nested or not.

A fresh, short run: a focused system prompt, the mission, its context and the results of
the agents it depends on, and only the scoped `use_skill` tool (plus dispatch_agent and
get_agent_results for an agent whose profile delegates, within the depth limit). Every
answer is stored (LLMCall, keyed by the agent and its step) before its tools run, and
every skill call is keyed by (dispatch, tool_call_id, skill, arguments), so a delivery
after a crash, a pause or a wait for its own agents replays the stored steps and picks
up where the last one stopped, without asking the model or running a side effect twice.

Replaying is also what makes the budgets the agent's own: its tool and token counts are
rebuilt from the replayed steps, exactly as they stood when each step was first taken.
The wall clock runs from the agent's first start (`deadline_at`).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from orchestration.budgets.budget import reserve_skill_call, skill_started_event
from orchestration.budgets.limits import Limits
from orchestration.budgets.pricing import call_cost
from orchestration.budgets.spending import (
    SpendMeter,
    agent_call_release,
    agent_call_reserve,
    caps_for,
)
from orchestration.delivery import runner
from orchestration.delivery.leases import VERIFIED_SECONDS, LeaseLost, lease_until, new_token
from orchestration.delivery.queue import Claimed
from orchestration.engine import steps
from orchestration.engine.delegation import (
    can_delegate,
    dispatch_batch,
    dispatch_result_json,
    profiles_by_name,
    skill_domains,
)
from orchestration.engine.prompts import agent_system_prompt, agent_task_message, user_local_time
from orchestration.engine.steps import Next
from orchestration.engine.toolcalls import error_json, load_json, parse_arguments
from orchestration.engine.tooldefs import (
    DISPATCH_AGENT,
    GET_AGENT_RESULTS,
    delegation_tools,
    get_agent_results_parameters,
)
from orchestration.engine.toolids import unique_ids
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.llm import LLMError, LLMResponse, ToolCall, Usage, capacity, get_provider
from orchestration.models import (
    WORKING_TURN_STATUSES,
    AgentDispatch,
    DispatchOutcome,
    DispatchState,
    LLMCall,
    TurnStatus,
)
from orchestration.questions import approvals, doubts
from orchestration.questions.pauses import turn_pause
from orchestration.records.catalogue import (
    AGENT_ATTEMPT,
    AGENT_FAILED,
    AGENT_LLM_CALL,
    AGENT_WAITING_FOR_MERGE,
    LLM_WAITING,
    SKILL_FINISHED,
)
from orchestration.records.compiled import CompiledRead, attnames, related_attnames
from orchestration.records.events import event_new, event_record, events_record
from orchestration.records.inserts import llm_call_record
from orchestration.reports.errors import failure_of
from skills.executor import Ahead, SkillOutcome, ahead_saved, execute_skill, run_ahead
from skills.tools import use_skill_tool

logger = logging.getLogger(__name__)

USE_SKILL = "use_skill"
# Replies that move nothing on (empty, cut off, or only calls to tools the agent does not
# have) are answered with a nudge; this many in a row and the agent stops.
MAX_IDLE_REPLIES = 3
TAKE_COUNTERS = """
    UPDATE orchestration_turn SET agent_llm_calls = agent_llm_calls + %s, skill_calls = skill_calls + %s
    WHERE id = %s AND status IN (%s, %s) AND agent_llm_calls < %s
      AND skill_calls <= %s AND skill_calls <= %s - prior_window_calls
      AND EXISTS (SELECT 1 FROM orchestration_agentdispatch AS agent
                  WHERE agent.id = %s AND agent.turn_id = orchestration_turn.id
                    AND agent.lease_token = %s AND agent.state = %s)
"""  # Agent._take_counters: Turn's and AgentDispatch's tables


@dataclass(kw_only=True)
class Agent:
    """An agent on this delivery: its row, its conversation so far and its counters,
    rebuilt by replaying its stored steps (which is what makes its budgets its own)."""

    dispatch: AgentDispatch
    token: str
    first_start: bool
    label: str = ""
    first_step: int = 0
    limits: Limits | None = None
    provider: object = None
    user: object = None
    delegates: bool = False
    tools: list[dict] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    stored: dict[str, dict] = field(default_factory=dict)
    usage: Usage = Usage()  # of every answer so far, stored ones included
    spend: SpendMeter | None = None  # this delivery's calls against the owner's allowance
    counted: bool = False  # the next call is counted against the turn's cap already
    ran_ahead: dict[str, Ahead] = field(default_factory=dict)  # this step's read-only calls, run before it is stored
    verified_at: float = float("-inf")  # when the lease was last found ours (time.monotonic)
    ended: bool = False  # its report was stored with its end, in one transaction (`_store_report`)
    renewed_at: float = float("-inf")  # when it was last renewed
    llm_calls: int = 0
    used: int = 0
    idle: int = 0
    last_text: str = ""
    # The outside content that has reached the agent: from its dispatch (the orchestrator's
    # or its parent's reading), its dependencies' reports and every result since (a replay
    # rebuilds it from the stored results).
    outside: list[str] = field(default_factory=list)

    # --- claim and replay ---------------------------------------------------------------

    @classmethod
    @transaction.atomic
    def claim(cls, dispatch_id: int) -> Agent | None:
        """created → running, if it is (a second delivery, or one for an agent that is
        waiting or done, claims nothing)."""
        found = _agents_read([dispatch_id], state=DispatchState.CREATED, turn_working=True)
        if not found:
            # Its turn is paused (or over): this delivery is spent. Unstamped, the agent
            # is queued again by the schedule rule when the turn resumes.
            AgentDispatch.objects.filter(pk=dispatch_id, state=DispatchState.CREATED).exclude(
                turn__status__in=WORKING_TURN_STATUSES).update(queued_at=None)
            return None
        dispatch = found[0]
        first_start, counted, awaited = dispatch.started_at is None, False, dispatch.awaiting
        if first_start:
            with transaction.atomic():  # one commit: the claim, its event and its first call counted
                started, counted = lifecycle.agents_start([dispatch])
            if not started:
                return None
        else:
            token, now = new_token(), timezone.now()
            with transaction.atomic():  # one commit: the claim and its event
                if not lifecycle.transition(
                    dispatch_id, source=DispatchState.CREATED, target=DispatchState.RUNNING,
                    lease_token=token, lease_expires_at=lease_until(), heartbeat_at=now, queued_at=None, awaiting={},
                ):
                    return None
                dispatch.state, dispatch.lease_token, dispatch.awaiting = DispatchState.RUNNING, token, {}
                reason = "its agents finished" if awaited else "redelivered"
                event_record(type=AGENT_ATTEMPT, dispatch=dispatch,
                             summary=f"{dispatch.agent_id} resumed ({reason})",
                             payload={"sub_agent_id": dispatch.agent_id, "reason": reason,
                                      "crashes": dispatch.crashes, "awaited": (awaited or {}).get("agent_ids", [])})
        claimed = time.monotonic()  # its lease just taken: the first call need not ask again
        return cls(dispatch=dispatch, token=dispatch.lease_token, first_start=first_start, renewed_at=claimed,
                   verified_at=claimed, counted=counted, label=f"agent {dispatch.agent_id} (dispatch {dispatch.pk})")

    @classmethod
    def claim_many(cls, dispatch_ids: list[int]) -> dict[int, Agent]:
        """Agents that became ready together (one dispatch answer, one finished
        dependency), each claimed as `claim` would, the first starts in one transaction of
        four statements however many there are (read them, move them, their events, and
        their first model calls counted against the turn's cap), and their owner's caps
        read once: claimed one by one, eight agents of a dispatch answer started one after
        another on the process's database threads, each then counting its first call."""
        if len(dispatch_ids) == 1:
            return {pk: agent for pk in dispatch_ids if (agent := cls.claim(pk)) is not None}
        ready = {dispatch.pk: dispatch for dispatch in _agents_read(
            dispatch_ids, state=DispatchState.CREATED, turn_working=True, never_started=True)}
        # Not found: not ready (claim says why) or resumed (claim writes why): one by one.
        claimed = {pk: agent for pk in dispatch_ids if pk not in ready and (agent := cls.claim(pk)) is not None}
        if not ready:
            return claimed
        with transaction.atomic():
            started, counted = lifecycle.agents_start([ready[pk] for pk in dispatch_ids if pk in ready])
        return claimed | cls._begun(started, {dispatch.pk: counted for dispatch in started})

    @classmethod
    def adopt_many(cls, claimed: list[Claimed]) -> dict[int, Agent]:
        """Agents claimed for this runner by the transaction that made them ready
        (lifecycle.agents_deliver): their rows read in one statement, and nothing
        written; one that is no longer running under its lease (stopped since) is left."""
        items = {item.item_id: item for item in claimed}
        rows = _agents_read(list(items), state=DispatchState.RUNNING)
        started = [dispatch for dispatch in rows if dispatch.lease_token == items[dispatch.pk].token]
        return cls._begun(started, {pk: item.counted for pk, item in items.items()})

    @classmethod
    def _begun(cls, started: list[AgentDispatch], counted: dict[int, bool]) -> dict[int, Agent]:
        """Agents whose first start was just claimed, their owner's caps read once."""
        owners = {dispatch.turn.conversation.owner_id: dispatch.turn.conversation.owner for dispatch in started}
        caps = {pk: caps_for(owner) for pk, owner in owners.items()}  # read once, as each delivery would
        claimed_at = time.monotonic()
        return {dispatch.pk: cls(
            dispatch=dispatch, token=dispatch.lease_token, first_start=True, renewed_at=claimed_at,
            verified_at=claimed_at, counted=counted[dispatch.pk], label=f"agent {dispatch.agent_id} (dispatch {dispatch.pk})",
            spend=SpendMeter(owners[dispatch.turn.conversation.owner_id],
                             caps=caps[dispatch.turn.conversation.owner_id])) for dispatch in started}

    def load(self) -> None:
        """The run as the store has it (again, after a transient database error)."""
        dispatch = self.dispatch
        limits = self.limits = Limits.from_json(dispatch.turn.limits)
        self.delegates = can_delegate(dispatch, limits)
        profile_prompt = dispatch.profile.system_prompt if dispatch.profile else ""
        prior = _prior_results(dispatch)
        self.provider = self.provider or get_provider()
        self.user = dispatch.turn.conversation.owner
        self.spend = self.spend or SpendMeter(self.user)
        self.tools = [use_skill_tool(dispatch.skills, self.user)] + (_delegation_tools(dispatch, limits) if self.delegates else [])
        self.messages = [
            {"role": "system", "content": agent_system_prompt(
                local_time=user_local_time(dispatch.turn), profile_prompt=profile_prompt, delegates=self.delegates)},
            {"role": "user", "content": agent_task_message(
                mission=dispatch.mission, context=dispatch.context, prior_results=prior)},
        ]
        self.stored = {} if self.first_start else _stored_responses(dispatch)
        self.first_start = False  # a reload must read what this delivery stored
        self.outside = lifecycle.merged(dispatch.outside, *[r.get("outside_content", []) for r in prior])
        self.usage, self.llm_calls, self.used, self.idle, self.last_text = Usage(), 0, 0, 0, ""

    def replayed(self, step: int) -> LLMResponse | None:
        stored = self.stored.get(_key(self.dispatch, step))
        return LLMResponse.from_json(stored) if stored is not None else None

    # --- asking -------------------------------------------------------------------------

    @property
    def tokens(self) -> int:
        return self.usage.prompt_tokens + self.usage.completion_tokens

    @property
    def model(self) -> str:
        return self.dispatch.model or settings.ASSISTANT_AGENT_MODEL

    def progress(self, taking: LLMResponse | None = None) -> dict:
        """What the row keeps of the run so far, written with the next heartbeat (or the
        end): a crash in between loses nothing a replay does not rebuild. With `taking`,
        as it will stand once that answer is taken in (`act`)."""
        messages, usage, calls = self.messages[1:], self.usage, self.llm_calls
        if taking is not None:
            messages, usage, calls = messages + [taking.as_message()], usage + taking.usage, calls + 1
        return {"transcript": messages, "tool_calls_used": self.used, "llm_calls": calls,
                "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                "cached_tokens": usage.cached_tokens}

    def check(self, **fields) -> Next | None:
        """Renew the lease (writing `fields`) while the agent may go on; else say why
        not: the turn paused (let go), ended or the agent was stopped, or another worker
        holds it now (stop), or this process is ending (hand back)."""
        if runner.handing_back():
            return steps.HAND_BACK
        live = AgentDispatch.objects.filter(pk=self.dispatch.pk, lease_token=self.token, state=DispatchState.RUNNING,
                                            turn__status__in=WORKING_TURN_STATUSES)
        if live.update(lease_expires_at=lease_until(), heartbeat_at=timezone.now(), **fields):
            self.verified_at = self.renewed_at = time.monotonic()
            return None
        state, status, token = AgentDispatch.objects.values_list("state", "turn__status", "lease_token").get(
            pk=self.dispatch.pk)
        if status == TurnStatus.PAUSED and state == DispatchState.RUNNING and token == self.token:
            return Next(steps.Kind.PAUSE)
        return steps.STOP

    def before_call(self) -> Next | None:
        """Before a new model call (a stored step passed these checks when it was taken):
        the lease, then the wall clock and token budget from the agent's first start and
        first call, whatever deliveries came between; then the call is counted against the
        turn's cap and the owner's allowance (either trips a pause: LimitTripped)."""
        if runner.handing_back():
            return steps.HAND_BACK
        if time.monotonic() - self.verified_at > VERIFIED_SECONDS and (stop := self.check()) is not None:
            return stop
        limits, dispatch = self.limits, self.dispatch
        if self.tokens >= limits.agent_token_budget:
            return steps.done(DispatchOutcome.BUDGET_EXCEEDED, _partial(
                self.last_text, self.messages, note=f"token budget of {limits.agent_token_budget} spent"))
        if dispatch.deadline_at is not None and timezone.now() >= dispatch.deadline_at:
            # A Continue may have moved the deadline on since this delivery read it.
            dispatch.deadline_at = AgentDispatch.objects.values_list("deadline_at", flat=True).get(pk=dispatch.pk)
            if timezone.now() >= dispatch.deadline_at:
                return steps.done(DispatchOutcome.TIMEOUT, _partial(self.last_text, self.messages),
                                  f"wall-clock limit of {limits.agent_timeout_seconds:.0f}s reached")
        if not self.counted:  # the step before counted it, unless it could not (or this is the first)
            agent_call_reserve(turn_id=dispatch.turn_id, limits=limits)
            self.counted = True
        try:
            self.spend.reserve(model=self.model, messages=self.messages, tools=self.tools)
        except Exception:
            agent_call_release(turn_id=dispatch.turn_id)  # the call the allowance refused is not made
            self.counted = False
            raise
        return None

    def request(self) -> dict:
        return {"provider": self.provider, "model": self.model, "messages": self.messages, "tools": self.tools,
                "max_tokens": self.spend.max_tokens}

    def retries(self) -> tuple[int, int]:
        return self.dispatch.retries, self.limits.agent_max_retries

    @transaction.atomic
    def record_retry(self, retry: int, exc: LLMError, delay: float, step: int, took_ms: int) -> Next | None:
        if (stop := self.check(retries=retry)) is not None:
            return stop
        dispatch = self.dispatch
        dispatch.retries = retry
        event_record(
            type=AGENT_ATTEMPT, dispatch=dispatch,
            summary=f"{dispatch.agent_id} retry {retry} in {delay:.1f}s: {str(exc)[:120]}",
            payload={"sub_agent_id": dispatch.agent_id, "retry": retry, "step": step, "reason": str(exc),
                     "backoff_seconds": delay, "duration_ms": took_ms},
        )
        return None

    def priority(self) -> capacity.Priority:
        """After every orchestrator call; users in turn; a parent before its nested agents."""
        return capacity.Priority(orchestrator=False, user=self.user.pk if self.user else None,
                                 depth=self.dispatch.depth)

    @transaction.atomic
    def record_wait(self, step: int, waited: float, model: str) -> None:
        """The wait for the provider's rate limit, in the timeline; the agent's wall clock
        moves on by it (by at most its whole wall-clock limit): waiting is not its work."""
        dispatch = self.dispatch
        excused = timedelta(seconds=min(waited, self.limits.agent_timeout_seconds))
        AgentDispatch.objects.filter(pk=dispatch.pk, deadline_at__isnull=False).update(
            deadline_at=F("deadline_at") + excused)
        if dispatch.deadline_at is not None:
            dispatch.deadline_at += excused
        event_record(type=LLM_WAITING, dispatch=dispatch,
                     summary=f"{dispatch.agent_id} step {step + 1}: waited {waited:.1f}s for the provider's rate limit",
                     payload={"sub_agent_id": dispatch.agent_id, "step": step, "model": model,
                              "waited_ms": int(waited * 1000)})

    def release_reservation(self) -> None:
        self.spend.release()

    def charge(self, response: LLMResponse) -> None:
        self.spend.settle(response.usage, call_cost(response.model or self.model, response.usage))

    def settle_up(self) -> None:
        """What this delivery still owes the counters, however it ended: the spend of
        calls made without a reservation, and a next call counted but never made."""
        if self.counted:
            agent_call_release(turn_id=self.dispatch.turn_id)
            self.counted = False
        if self.spend is not None:
            self.spend.flush()

    def ahead(self, step: int, response: LLMResponse) -> LLMResponse:
        """The answer as it will be stored (its tool calls named uniquely in the agent's
        run), with its read-only skill calls run already (skills/executor.py `run_ahead`):
        their rows and events are stored with the answer, in the step's one transaction.
        Only when the whole answer's skill calls fit the agent's tool budget; a call that
        is not such a call runs the usual way once the answer is stored."""
        taken = {c["id"] for m in self.messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []}
        response = replace(response, tool_calls=unique_ids(response.tool_calls, taken, suffix=str(step),
                                                           blank=f"call_{step}_"))
        self.ran_ahead = {}
        skill_calls = [call for call in response.tool_calls if call.name == USE_SKILL]
        if not skill_calls or self.used + len(skill_calls) > self.dispatch.max_tool_calls:
            return response
        dispatch = self.dispatch
        for call in skill_calls:
            arguments, error = load_json(call.arguments)
            if error or not isinstance(arguments, dict) or not isinstance(arguments.get("skill"), str):
                continue
            ran = run_ahead(name=arguments["skill"], arguments=arguments.get("arguments", {}), user=self.user,
                            tool_call_id=call.id, scope={"dispatch": dispatch}, granted=dispatch.skills,
                            time_zone=dispatch.turn.time_zone, outside=self.outside)
            if ran is not None:
                self.ran_ahead[call.id] = ran
        return response

    def store(self, step: int, response: LLMResponse, duration_ms: int) -> Next | None:
        """Store the answer before anything acts on it (a replay reuses it), with its
        event, in one transaction. Its key is the agent's and the step's: when another
        delivery stored this step first, this one replays what is stored (or finds it
        is not its work any more)."""
        try:
            return self._store(step, response, duration_ms)
        except IntegrityError:
            self.ran_ahead = {}
            raise steps.StoredElsewhere(self.label) from None

    @transaction.atomic
    def _store(self, step: int, response: LLMResponse, duration_ms: int) -> Next | None:
        """The step's one short transaction, in the steady state four statements: the
        answer (an INSERT); the turn's counters, which also checks that the agent is
        still ours and its turn live (an UPDATE: the next call and the calls run ahead,
        within the turn's and the conversation's limits); the rows of the calls run
        ahead (an INSERT); and every event of the step (an INSERT). The lease is renewed
        only when a third of it has passed. When the counters cannot be taken (a limit,
        a Stop, a pause), the calls run ahead are forgotten and the answer is stored the
        way that finds out why: nothing acts on it here, or its calls run the usual way."""
        dispatch = self.dispatch
        usage = response.usage
        llm_call_record(LLMCall(  # first: a step another delivery stored rolls back nothing else
            turn_id=dispatch.turn_id, dispatch=dispatch, key=_key(dispatch, step),
            model=response.model or dispatch.model, response=response.to_json(), duration_ms=duration_ms,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens, cost_usd=call_cost(response.model or dispatch.model, usage),
        ))
        self.stored[_key(dispatch, step)] = response.to_json()
        self.counted = False  # the call that was counted is made
        if (report := _report(response)) is not None:
            return self._store_report(step, response, duration_ms, report)
        next_call = bool(response.tool_calls)  # an answer with tool calls is followed by another call
        if self._take_counters(next_call=next_call, skill_calls=len(self.ran_ahead)):
            self.counted = next_call
            self.verified_at = time.monotonic()
            ahead = ahead_saved(list(self.ran_ahead.values()), user=self.user)
            self.ran_ahead = {call.row.tool_call_id: call for call in ahead}
            events_record([_step_event(dispatch, step, response, duration_ms)]
                          + [event for call in ahead for event in _ahead_events(dispatch, call)])
            if time.monotonic() - self.renewed_at > settings.ASSISTANT_LEASE_SECONDS / 3:
                self._hold()
                self.renewed_at = time.monotonic()
            return None
        self.ran_ahead = {}
        stop = self.check()  # stopped or paused during the call: nothing acts on it here
        # Stopped (or ended, or taken over): the answer is paid for and in the audit, so
        # the timeline says so too, and the page's counters, which follow events, count it.
        events_record([_step_event(dispatch, step, response, duration_ms, too_late=stop is steps.STOP)])
        return stop

    def _store_report(self, step: int, response: LLMResponse, duration_ms: int, report: Next) -> Next | None:
        """The agent's `report`, stored with its end in the same transaction:
        the answer, the agent's row (which also checks that it is still ours and its turn
        live), both events, the turn's tokens and the schedule rule. One commit where a
        store and then an end took two, on the path every agent's end and every
        dependency's hand-off takes. `act` then finds the agent done, and `end` that it
        is written."""
        if _finish(self.dispatch, self.token, outcome=report.outcome, result=report.result, error="",
                   progress={**self.progress(taking=response), "outside": self.outside},
                   usage=self.usage + response.usage, turn_live=True,
                   step_events=[_step_event(self.dispatch, step, response, duration_ms)]):
            transaction.on_commit(lambda: setattr(self, "ended", True))
            return None
        stop = self.check()  # as for an answer whose counters could not be taken
        events_record([_step_event(self.dispatch, step, response, duration_ms, too_late=stop is steps.STOP)])
        return stop

    def _take_counters(self, *, next_call: bool, skill_calls: int) -> bool:
        """One conditional UPDATE of the turn: count the next call and `skill_calls`
        calls run ahead, while the agent holds its lease and the turn is live, within
        the limits this delivery read (a Continue only raises them: the slow way reads
        them again). EXISTS, not a join: see orchestration/budgets/budget.py. Written
        out, not built with the ORM: compiling it was half of storing a step."""
        limits, dispatch = self.limits, self.dispatch
        most_calls = limits.turn_max_llm_calls if next_call else 2**31 - 1
        with connection.cursor() as cursor:
            cursor.execute(TAKE_COUNTERS, [
                int(next_call), skill_calls, dispatch.turn_id, *WORKING_TURN_STATUSES, most_calls,
                limits.turn_max_skill_calls - skill_calls, limits.conversation_max_skill_calls - skill_calls,
                dispatch.pk, self.token, DispatchState.RUNNING])
            return cursor.rowcount == 1

    # --- acting -------------------------------------------------------------------------

    def acts_on_skills(self, response: LLMResponse) -> bool:
        return any(call.name == USE_SKILL for call in response.tool_calls)

    def act(self, step: int, response: LLMResponse) -> Next:
        """Take in the answer: answer its tool calls, or see that the agent is done."""
        dispatch, messages = self.dispatch, self.messages
        ahead, self.ran_ahead = self.ran_ahead, {}  # stored with this answer (none for a replayed one)
        seen = list(self.outside)  # what had reached the agent when the model wrote these calls
        self.usage = self.usage + response.usage
        self.llm_calls += 1
        messages.append(response.as_message())
        self.last_text = response.content or self.last_text
        if (report := _report(response)) is not None:
            return report
        if not response.tool_calls:
            self.idle += 1
            if self.idle >= MAX_IDLE_REPLIES:
                return _idle_stop(self.idle, self.last_text, messages)
            messages.append({"role": "user", "content": "Your reply was empty or cut off. Reply with a short report."})
            return steps.AGAIN
        dispatch_calls = [call for call in response.tool_calls if call.name == DISPATCH_AGENT]
        dispatched = self._children_dispatch(dispatch_calls, step, seen) if self.delegates and dispatch_calls else {}
        known = {USE_SKILL, DISPATCH_AGENT, GET_AGENT_RESULTS} if self.delegates else {USE_SKILL}
        self.idle = 0 if any(call.name in known for call in response.tool_calls) else self.idle + 1
        for call in response.tool_calls:
            if call.name in (DISPATCH_AGENT, GET_AGENT_RESULTS) and not self.delegates:
                content = error_json(_refusal(dispatch, self.limits))
            elif call.name == DISPATCH_AGENT:
                content = dispatched[call.id]
            elif call.name == GET_AGENT_RESULTS:
                content = self._children_results(call)
                if content is None:
                    return steps.WAIT
                self.outside = lifecycle.merged(self.outside, *AgentDispatch.objects.filter(parent=dispatch)
                                                .values_list("outside", flat=True))
            elif call.name != USE_SKILL:
                tools_text = ("the tools are use_skill, dispatch_agent and get_agent_results" if self.delegates
                              else "the only tool is use_skill")
                content = error_json(f"unknown tool {call.name!r}; {tools_text}.")
            elif self.used >= dispatch.max_tool_calls:
                content = error_json("tool budget spent; no more tool calls are possible.")
            elif call.id in ahead:
                self.used += 1
                outcome = ahead[call.id].outcome
                content = outcome.as_tool_content()
                self.outside = lifecycle.merged(self.outside, list(outcome.outside))
            else:
                self.used += 1
                self.verified_at = float("-inf")  # it took time: the next call asks first
                content, outside = _use_skill(dispatch, self.token, self.user, call, seen)
                self.outside = lifecycle.merged(self.outside, outside)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if dispatch_calls:
            self.save_progress()  # a replay answers these calls from the transcript
        if self.used >= dispatch.max_tool_calls:
            return steps.done(DispatchOutcome.BUDGET_EXCEEDED, _partial(
                self.last_text, messages, note=f"tool budget of {dispatch.max_tool_calls} calls spent"))
        if self.idle >= MAX_IDLE_REPLIES:
            return _idle_stop(self.idle, self.last_text, messages)
        return steps.AGAIN

    def save_progress(self) -> None:
        AgentDispatch.objects.filter(pk=self.dispatch.pk).update(**self.progress())

    def _children_dispatch(self, calls: list[ToolCall], step: int, outside: list[str]) -> dict[str, str]:
        """Answer one answer's dispatch_agent calls, by tool-call id. Each child starts
        with `outside`, the outside content that had reached the parent when its model
        wrote the calls. On replay a call that created its child answers "dispatched"
        again, and a refused call gets its stored refusal back."""
        dispatch = self.dispatch
        done = {c.tool_call_id: c for c in dispatch.children.filter(tool_call_id__in=[call.id for call in calls])}
        stored = {m.get("tool_call_id"): m.get("content") for m in dispatch.transcript or [] if m.get("role") == "tool"}
        answers: dict[str, str] = {}
        fresh = []
        for call in calls:
            if call.id in done:
                answers[call.id] = dispatch_result_json(done[call.id].agent_id)
            elif stored.get(call.id):
                answers[call.id] = stored[call.id]
            else:
                fresh.append(call)
        if not fresh:
            return answers
        task_prompt = (dispatch.contract or {}).get("parent", {}).get("task_prompt") or dispatch.mission
        domains = skill_domains(fresh, self.user)
        with transaction.atomic():
            turn = lifecycle.lock_turn(dispatch.turn_id)
            self._hold()
            planned = dispatch_batch(turn=turn, calls=fresh, task_prompt=task_prompt, domains=domains, parent=dispatch,
                                     step_idx=step, outside=outside)
            for item in planned:
                answers[item.call.id] = (error_json(item.error, agent_id=item.spec.get("agent_id")) if item.error
                                         else dispatch_result_json(item.spec["agent_id"]))
        return answers

    def _children_results(self, call: ToolCall) -> str | None:
        """The parent's get_agent_results: its children's results, or None after it went
        to `waiting` (nothing held; its last child to finish wakes it).

        Without ids: the children dispatched so far in this run's history (so a replay of
        an earlier call does not see children dispatched later). Other agents are not_found."""
        arguments, error = parse_arguments(
            call.arguments, get_agent_results_parameters(default="every helper you dispatched"))
        if error:
            return error_json(error)
        dispatch, messages = self.dispatch, self.messages
        dispatched = {c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []}
        with transaction.atomic():
            lifecycle.lock_turn(dispatch.turn_id)
            self._hold(**self.progress())  # the wait ends this delivery: the row has the run so far
            children = list(dispatch.children.all())
            names = arguments.get("agent_ids") or [c.agent_id for c in children if c.tool_call_id in dispatched]
            found = {c.agent_id: c for c in children if c.agent_id in names}
            if any(not lifecycle.is_terminal(c) for c in found.values()):
                lifecycle.transition(dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.WAITING,
                                     where={"lease_token": self.token}, lease_token="", lease_expires_at=None,
                                     awaiting={"tool_call_id": call.id, "agent_ids": sorted(found)})
                return None
            return json.dumps(lifecycle.dispatch_results_collect(names, found))

    def _hold(self, **fields) -> None:
        """Renew the lease inside the caller's transaction, or stop writing (LeaseLost)."""
        if not AgentDispatch.objects.filter(pk=self.dispatch.pk, lease_token=self.token,
                                            state=DispatchState.RUNNING).update(lease_expires_at=lease_until(), **fields):
            raise LeaseLost(f"AgentDispatch {self.dispatch.pk}: lease lost")

    def too_many_steps(self) -> Next:
        return steps.done(DispatchOutcome.FAILED, _partial(self.last_text, self.messages), "no report after too many steps")

    # --- ending -------------------------------------------------------------------------

    def end(self, next_step: Next) -> None:
        kind, dispatch = next_step.kind, self.dispatch
        if self.ended:  # with its report (`_store_report`)
            return
        if kind is steps.Kind.DONE:
            _finish(dispatch, self.token, outcome=next_step.outcome, result=next_step.result, error=next_step.error,
                    progress={**self.progress(), "outside": self.outside}, usage=self.usage)
        elif kind is steps.Kind.PAUSE and next_step.trip is not None:
            # Paused, then given back, in one transaction under the turn's lock: a Continue
            # comes before both or after both (and then finds it to queue).
            with transaction.atomic():
                turn_pause(turn_id=dispatch.turn_id, trip=next_step.trip, releasing=dispatch.pk)
                lifecycle.agent_give_back(dispatch.pk, self.token, **self.progress())
        elif kind in (steps.Kind.PAUSE, steps.Kind.HAND_BACK):
            lifecycle.agent_give_back(dispatch.pk, self.token, **self.progress())


def _agents_read(ids: list[int], *, state: str, turn_working: bool = False,
                 never_started: bool = False) -> list[AgentDispatch]:
    """The agents of `ids` in `state` (with `turn_working`, of a turn that runs or waits;
    with `never_started`, not begun before), with what a delivery reads of them: their
    turn, its conversation and owner, and their profile, as `select_related` loads them."""
    return _agents_statement(len(ids), state, turn_working, never_started).instances(AgentDispatch, *ids)


@functools.lru_cache(maxsize=64)
def _agents_statement(count: int, state: str, turn_working: bool, never_started: bool) -> CompiledRead:
    """Every claim reads its agents so, one agent or a wave's: compiled once per shape."""
    def build(*ids):
        rows = AgentDispatch.objects.filter(pk__in=ids, state=state)
        if turn_working:
            rows = rows.filter(turn__status__in=WORKING_TURN_STATUSES)
        if never_started:
            rows = rows.filter(started_at=None)
        return rows.order_by().values_list(*_AGENT_COLUMNS)
    return CompiledRead(build, arity=count)


_AGENT_COLUMNS = (*attnames(AgentDispatch), *(column for path in (
    "turn", "turn__conversation", "turn__conversation__owner", "profile")
    for column in related_attnames(AgentDispatch, path)))


def _delegation_tools(dispatch: AgentDispatch, limits: Limits) -> list[dict]:
    return delegation_tools(profile_names=list(profiles_by_name()), max_tool_calls_cap=limits.agent_max_tool_calls_cap,
                            depth=dispatch.depth, max_depth=limits.max_delegation_depth)


def _refusal(dispatch: AgentDispatch, limits: Limits) -> str:
    """Why this agent may not delegate (it called a tool it was not given)."""
    if dispatch.depth >= limits.max_delegation_depth:
        return (f"nested delegation is limited to depth {limits.max_delegation_depth}: "
                f"{dispatch.agent_id} is at depth {dispatch.depth} and cannot dispatch agents. "
                "Do the work yourself with use_skill.")
    return f"{dispatch.agent_id} may not dispatch agents (its profile does not delegate); its only tool is use_skill."


def _report(response: LLMResponse) -> Next | None:
    """The agent's end, if `response` is its report: no tool calls, and text not cut off."""
    if response.tool_calls or not response.content.strip() or response.finish_reason == "length":
        return None
    return steps.done(DispatchOutcome.COMPLETED, response.content)


def _step_event(dispatch: AgentDispatch, step: int, response: LLMResponse, duration_ms: int, *,
                too_late: bool = False):
    """The step in the timeline, and the agent's progress in the graph (its step count)."""
    skills = [_skill_named(call) for call in response.tool_calls]
    doing = ", ".join(skills) if skills else f"report ({response.finish_reason})"
    if too_late:
        doing = "answered too late to act on"
    usage = response.usage
    return event_new(
        type=AGENT_LLM_CALL, dispatch=dispatch, summary=f"{dispatch.agent_id} step {step + 1}: {doing}",
        payload={"step": step + 1, "model": response.model or dispatch.model, "duration_ms": duration_ms,
                 "finish_reason": response.finish_reason, "tool_calls": skills,
                 "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                           "cached_tokens": usage.cached_tokens}},
    )


def _skill_named(call: ToolCall) -> str:
    """What a tool call asks for, in a word: the skill a use_skill names, else the tool."""
    if call.name == USE_SKILL:
        arguments, error = load_json(call.arguments)
        if not error and isinstance(arguments, dict) and isinstance(arguments.get("skill"), str):
            return arguments["skill"][:100]
    return call.name[:100]


def _finished_event(dispatch: AgentDispatch, skill: str, outcome: SkillOutcome):
    status = outcome.status if outcome.ok or outcome.status != "failed" else f"failed ({outcome.error_kind})"
    return event_new(
        type=SKILL_FINISHED, dispatch=dispatch, summary=f"{dispatch.agent_id} ← {skill}: {status}",
        payload={"skill": skill, "status": outcome.status, "ok": outcome.ok, "error": outcome.error,
                 "error_kind": str(outcome.error_kind or ""), "duration_ms": outcome.duration_ms,
                 "execution_id": outcome.execution_id, "outside": list(outcome.outside)},
    )


def _ahead_events(dispatch: AgentDispatch, call: Ahead) -> list:
    """A call run ahead, as the usual way records one: started, then finished."""
    row = call.row
    return [skill_started_event(dispatch, row.skill, row.arguments), _finished_event(dispatch, row.skill, call.outcome)]


def _key(dispatch: AgentDispatch, step: int) -> str:
    return f"agent:{dispatch.pk}:s{step}"


def _idle_stop(idle: int, last_text: str, messages: list[dict]) -> Next:
    return steps.done(DispatchOutcome.FAILED, _partial(last_text, messages),
                      f"no usable reply from the model {idle} times in a row (empty, cut off, or unknown tools)")


def _stored_responses(dispatch: AgentDispatch) -> dict[str, dict]:
    """The answers earlier deliveries stored, by key."""
    return dict(LLMCall.objects.filter(dispatch=dispatch).values_list("key", "response"))


def _use_skill(dispatch: AgentDispatch, token: str, user, call, seen: list[str]) -> tuple[str, list[str]]:
    """The tool message for a use_skill call, and the outside content its result holds.
    `seen`: the outside content that had reached the agent (approvals.gate)."""
    arguments, error = load_json(call.arguments)
    if error:
        return error_json(f"{error}; send {{\"skill\": ..., \"arguments\": {{...}}}}."), []
    if not isinstance(arguments, dict) or not isinstance(arguments.get("skill"), str):
        return error_json('use_skill needs {"skill": "<name>", "arguments": {...}}.'), []
    name, skill_arguments = arguments["skill"], arguments.get("arguments", {})

    def before_run(skill: str, skill_arguments: object) -> None:
        # In the transaction that opens the skill's row, just before its handler (for a
        # skill a handler calls too), and only while the agent holds its lease: a
        # dispatch cancelled (or reaped) since this step began runs no further side
        # effect, even among one answer's parallel calls.
        reserve_skill_call(dispatch=dispatch, skill=skill, arguments=skill_arguments, token=token)

    def after_run(skill: str, outcome: SkillOutcome) -> None:
        events_record([_finished_event(dispatch, skill, outcome)])

    outcome = execute_skill(
        name=name, arguments=skill_arguments, user=user, tool_call_id=call.id,
        scope={"dispatch": dispatch}, granted=dispatch.skills, before_run=before_run, after_run=after_run,
        clear=approvals.gate(dispatch=dispatch, user=user, outside=seen), doubt=doubts.ask(dispatch=dispatch),
        time_zone=dispatch.turn.time_zone,
        outside=seen,  # what rows the call writes were written from (skills/provenance.py)
    )
    return outcome.as_tool_content(), list(outcome.outside)


def _prior_results(dispatch: AgentDispatch) -> list[dict]:
    if not dispatch.depends_on:
        return []
    deps = AgentDispatch.objects.filter(turn_id=dispatch.turn_id, agent_id__in=dispatch.depends_on)
    return [lifecycle.fenced({"agent_id": d.agent_id, "status": lifecycle.result_status(d), "result": d.result}, d)
            for d in deps]


def _partial(last_text: str, messages: list[dict], *, note: str = "") -> str:
    results = [m["content"] for m in messages if m.get("role") == "tool"][-3:]
    parts = [f"({note}; partial result)"] if note else []
    if last_text:
        parts.append(last_text)
    if results:
        parts.append("Last tool results:\n" + "\n".join(r[:800] for r in results))
    return "\n".join(parts) or "No result."


@transaction.atomic(savepoint=False)
def _finish(dispatch: AgentDispatch, token: str, *, outcome: str, result: str, error: str, progress: dict,
            usage: Usage, turn_live: bool = False, step_events: list | None = None) -> bool:
    """running → waiting_for_merge (or failed), with the run's `progress` (transcript,
    counters, outside content), if the agent is still ours (and, with `turn_live`, its
    turn runs); the turn takes the agent's `usage`, and the schedule rule takes it from
    there. `step_events` (its last step's) go in the one INSERT with the end's."""
    now = timezone.now()
    ok = outcome in lifecycle.SUCCESS_OUTCOMES
    duration_ms = int((now - (dispatch.started_at or now)).total_seconds() * 1000)
    if not lifecycle.transition(
        dispatch.pk, source=DispatchState.RUNNING,
        target=DispatchState.WAITING_FOR_MERGE if ok else DispatchState.FAILED, where={"lease_token": token},
        turn_live=turn_live, outcome=outcome, result=result or error, error=error,
        finished_at=now, duration_ms=duration_ms, lease_token="", lease_expires_at=None, **progress,
    ):
        return False
    tool_calls = progress.get("tool_calls_used", dispatch.tool_calls_used)
    if ok:
        ended = event_new(type=AGENT_WAITING_FOR_MERGE, dispatch=dispatch,
                          summary=f"{dispatch.agent_id} finished ({outcome}, {tool_calls} tool call{'s' if tool_calls != 1 else ''})",
                          payload={"sub_agent_id": dispatch.agent_id, "outcome": outcome,
                                   "result": result[:4000], "tool_calls_used": tool_calls, "duration_ms": duration_ms})
    else:
        ended = event_new(type=AGENT_FAILED, dispatch=dispatch,
                          summary=f"{dispatch.agent_id} failed: {failure_of(error).words[:150]}",
                          payload={"sub_agent_id": dispatch.agent_id, "outcome": outcome, "error": error,
                                   "duration_ms": duration_ms})
    events_record([*(step_events or []), ended])
    lifecycle.turn_counter_add(dispatch.turn_id, prompt_tokens=usage.prompt_tokens,
                               completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens)
    lifecycle.dispatch_settle(turn_id=dispatch.turn_id, dispatch=dispatch)
    return True
