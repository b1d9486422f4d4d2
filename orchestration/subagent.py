"""The sub-agent loop (DESIGN.md §3–4): one django-q2 task per dispatch.

A fresh, short LLM loop: focused system prompt, the mission, its context and the results
of the agents it depends on, and only the scoped `use_skill` tool. Every model response
is stored (LLMCall, keyed by the agent and its step) before its tools run and every skill
call is keyed by (dispatch, tool_call_id, skill, arguments), so a delivery after a crash,
a pause or a wait for its own agents replays the stored steps and picks up where the
last one stopped, without asking the model or running a side effect twice.

Replaying is also what makes the budgets per agent rather than per delivery: the tool
and token counts are rebuilt from the replayed steps, exactly as they stood when each
step was first taken. The wall clock runs from the agent's first start (`deadline_at`).
A model call that fails transiently is retried where it failed (orchestration/retries.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from orchestration import dispatches as lifecycle
from orchestration import nesting
from orchestration.budgets.budget import reserve_skill_call
from orchestration.budgets.limits import Limits, LimitTripped
from orchestration.budgets.pricing import call_cost
from orchestration.budgets.spending import (
    Caps, Reservation, agent_call_release, agent_call_reserve, caps_for, spend_release, spend_reserve, spend_settle,
)
from orchestration.delegation import can_delegate
from orchestration.leases import LeaseLost, heartbeat, lease_until, new_token
from orchestration.llm import LLMError, LLMResponse, ToolCall, Usage, get_provider
from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, LLMCall, TurnStatus
from orchestration.prompts import agent_system_prompt, agent_task_message, user_local_time
from orchestration.questions import approvals
from orchestration.questions.pauses import turn_pause
from orchestration.records.catalogue import (
    AGENT_ATTEMPT,
    AGENT_FAILED,
    AGENT_LLM_CALL,
    AGENT_STARTED,
    AGENT_WAITING_FOR_MERGE,
    SKILL_FINISHED,
)
from orchestration.records.events import event_record
from orchestration.retries import complete_retrying
from orchestration.runner import HandBack, db
from orchestration import runner
from orchestration.tasks import enqueue_subagent
from orchestration.toolcalls import error_json, load_json
from orchestration.tooldefs import DISPATCH_AGENT, GET_AGENT_RESULTS
from skills.executor import SkillOutcome, execute_skill
from skills.tools import use_skill_tool

logger = logging.getLogger(__name__)

USE_SKILL = "use_skill"
MAX_STEPS = 50  # a hard stop beyond every budget below
# Replies that move nothing on (empty, cut off, or only calls to tools the agent does not
# have) are answered with a nudge; this many in a row and the agent stops.
MAX_IDLE_REPLIES = 3


class Cancelled(Exception):
    """The turn ended or was stopped: the agent stops at its next step."""


class Paused(Exception):
    """The turn paused on a limit: the agent goes back to `created` and resumes later."""


@dataclass
class Finish:
    outcome: str
    result: str
    error: str = ""


async def agent_run(dispatch_id: int) -> None:
    """One delivery of an agent (a runner job): claim it, run its loop, end it."""
    claimed = await db(_claim, dispatch_id)
    if claimed is None:
        return
    agent = await db(_Agent.load, *claimed)
    try:
        finish = await _loop(agent)
    except LeaseLost:
        logger.info("Dispatch %s: lease lost; another worker continues", dispatch_id)
        return
    except Cancelled:
        await db(lifecycle.dispatch_cancel, agent.dispatch, reason="cancelled")
        return
    except Paused:
        await db(_release, agent.dispatch, agent.token)
        return
    except HandBack:
        await db(_hand_back, agent.dispatch, agent.token)
        return
    except nesting.WaitForChildren:
        return  # back in `created`; the agent finishing last wakes it
    except LimitTripped as trip:
        await db(_release, agent.dispatch, agent.token)
        await db(turn_pause, turn_id=agent.dispatch.turn_id, trip=trip)
        return
    except LLMError as exc:
        finish = Finish(DispatchOutcome.FAILED, "", f"LLM error: {exc}")
    except Exception as exc:
        logger.exception("Dispatch %s failed", dispatch_id)
        finish = Finish(DispatchOutcome.FAILED, "", f"{type(exc).__name__}: {exc}")
    # `outside` is written only at the end: until then the row keeps what reached the agent
    # from outside its run (its dispatch), so a replay rebuilds exactly what each step had seen.
    await db(_finish, agent.dispatch, agent.token, finish, progress={**agent.progress(), "outside": agent.outside},
             usage=agent.usage)


@transaction.atomic
def _claim(dispatch_id: int) -> tuple[AgentDispatch, str, bool] | None:
    """(the dispatch, as this delivery holds it, its lease token, whether this is its
    first start), or None when it is not ours to run (claimed already, or not `created`)."""
    try:
        # get(), not first(): no ORDER BY to compile over four joined tables (3 ms of CPU).
        dispatch = (AgentDispatch.objects.select_related("turn__conversation__owner", "profile")
                    .get(pk=dispatch_id, state=DispatchState.CREATED))
    except AgentDispatch.DoesNotExist:
        return None
    token, now, awaited = new_token(), timezone.now(), dispatch.awaiting
    first_start = dispatch.started_at is None
    if first_start:
        timeout = timedelta(seconds=Limits.from_json(dispatch.turn.limits).agent_timeout_seconds)
        dispatch.started_at, dispatch.deadline_at = now, now + timeout
    if not lifecycle.transition(
        dispatch_id, source=DispatchState.CREATED, target=DispatchState.RUNNING,
        lease_token=token, lease_expires_at=lease_until(), heartbeat_at=now, queued_at=None,
        attempts=F("attempts") + 1, awaiting={}, started_at=dispatch.started_at, deadline_at=dispatch.deadline_at,
    ):
        return None
    dispatch.state, dispatch.lease_token, dispatch.awaiting = DispatchState.RUNNING, token, {}
    dispatch.attempts += 1
    if first_start:
        event_record(type=AGENT_STARTED, dispatch=dispatch, summary=f"{dispatch.agent_id} started",
                     payload={"sub_agent_id": dispatch.agent_id, "attempt": dispatch.attempts})
    else:
        reason = "its agents finished" if awaited else "redelivered"
        event_record(type=AGENT_ATTEMPT, dispatch=dispatch,
                     summary=f"{dispatch.agent_id} resumed ({reason})",
                     payload={"sub_agent_id": dispatch.agent_id, "attempt": dispatch.attempts, "reason": reason,
                              "awaited": (awaited or {}).get("agent_ids", [])})
    return dispatch, token, first_start


def _release(dispatch: AgentDispatch, token: str) -> bool:
    """Back to `created`: Continue starts it again and the replay skips finished steps."""
    return lifecycle.transition(dispatch.pk, source=DispatchState.RUNNING, target=DispatchState.CREATED,
                                where={"lease_token": token}, lease_token="", lease_expires_at=None)


@transaction.atomic
def _hand_back(dispatch: AgentDispatch, token: str) -> None:
    """This process is ending: back to `created` and onto the queue for another one."""
    if _release(dispatch, token):
        enqueue_subagent(dispatch.pk)


def _step_heartbeat(dispatch: AgentDispatch, token: str, **progress) -> None:
    """Before each step: renew the lease if the agent may go on, and write its `progress`
    (transcript, counters), in one UPDATE.

    Otherwise say why: the turn paused (Paused), ended or the agent was stopped
    (Cancelled), the reaper gave the agent to another worker (LeaseLost), or this
    process is ending (HandBack)."""
    if runner.handing_back():
        raise HandBack()
    live = AgentDispatch.objects.filter(
        pk=dispatch.pk, lease_token=token, state=DispatchState.RUNNING,
        turn__status__in=[TurnStatus.RUNNING, TurnStatus.WAITING],
    )
    if live.update(lease_expires_at=lease_until(), heartbeat_at=timezone.now(), **progress):
        return
    state, status = AgentDispatch.objects.values_list("state", "turn__status").get(pk=dispatch.pk)
    if status == TurnStatus.PAUSED:
        raise Paused()
    if status not in (TurnStatus.RUNNING, TurnStatus.WAITING) or state != DispatchState.RUNNING:
        raise Cancelled()
    raise LeaseLost(f"AgentDispatch {dispatch.pk}: lease lost")


async def _loop(agent: _Agent) -> Finish:
    """Ask, act, until the agent reports or a budget ends it. Only the model is awaited
    here; each step's database and skill work is one `db` call."""
    for step in range(MAX_STEPS):
        response = agent.stored_response(step)
        if response is None:
            stop = await db(agent.before_call)
            if stop is not None:
                return stop
            try:
                response, duration_ms = await _ask(agent, step)
            except Exception:
                await db(spend_release, reservation=agent.reservation)
                raise
            finish = await db(agent.store_and_act, step, response, duration_ms)
        else:
            await db(agent.heartbeat)
            finish = await db(agent.act, step, response)
        if finish is not None:
            return finish
    return Finish(DispatchOutcome.FAILED, _partial(agent.last_text, agent.messages),
                  f"no report after {MAX_STEPS} steps")


async def _ask(agent: _Agent, step: int) -> tuple[LLMResponse, int]:
    """A new model response for this step, and how long it took."""

    async def before_retry(retry: int, exc: LLMError, delay: float) -> None:
        await db(agent.record_retry, retry, exc, delay, step)
        await asyncio.sleep(delay)
        await db(agent.heartbeat)  # stopped or paused meanwhile: no further call

    dispatch = agent.dispatch
    return await complete_retrying(
        lambda: agent.provider.acomplete(model=dispatch.model, messages=agent.messages, tools=agent.tools,
                                         max_tokens=agent.reservation.max_tokens),
        used=dispatch.retries, allowed=agent.limits.agent_max_retries, before_retry=before_retry,
    )


@dataclass(kw_only=True)
class _Agent:
    """An agent on this delivery: its row, its conversation so far and its counters,
    rebuilt by replaying its stored steps (which is what makes its budgets its own)."""

    dispatch: AgentDispatch
    token: str
    limits: Limits
    provider: object
    user: object
    delegates: bool
    tools: list[dict]
    messages: list[dict]
    stored: dict[str, dict]
    usage: Usage = Usage()  # of every response so far, stored ones included
    reservation: Reservation | None = None  # of the model call being made (orchestration/budgets/spending.py)
    caps: Caps | None = None  # the owner's allowance, as this delivery read it
    llm_calls: int = 0
    used: int = 0
    idle: int = 0
    last_text: str = ""
    # The outside content that has reached the agent: from its dispatch (the orchestrator's
    # or its parent's reading), its dependencies' reports and every result since (a replay
    # rebuilds it from the stored results).
    outside: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, dispatch: AgentDispatch, token: str, first_start: bool) -> _Agent:
        limits = Limits.from_json(dispatch.turn.limits)
        delegates = can_delegate(dispatch, limits)
        profile_prompt = dispatch.profile.system_prompt if dispatch.profile else ""
        prior = _prior_results(dispatch)
        return cls(
            dispatch=dispatch, token=token, limits=limits, provider=get_provider(),
            user=dispatch.turn.conversation.owner, delegates=delegates,
            tools=[use_skill_tool(dispatch.skills)] + (nesting.tools_for(dispatch, limits) if delegates else []),
            messages=[
                {"role": "system", "content": agent_system_prompt(
                    local_time=user_local_time(dispatch.turn), profile_prompt=profile_prompt, delegates=delegates)},
                {"role": "user", "content": agent_task_message(
                    mission=dispatch.mission, context=dispatch.context, prior_results=prior)},
            ],
            stored={} if first_start else _stored_responses(dispatch),
            outside=lifecycle.merged(dispatch.outside, *[r.get("outside_content", []) for r in prior]),
        )

    @property
    def tokens(self) -> int:
        return self.usage.prompt_tokens + self.usage.completion_tokens

    def progress(self) -> dict:
        """What the row keeps of the run so far, written with the next heartbeat (or the
        end): a crash in between loses nothing a replay does not rebuild."""
        return {"transcript": self.messages[1:], "tool_calls_used": self.used, "llm_calls": self.llm_calls,
                "prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens,
                "cached_tokens": self.usage.cached_tokens}

    def heartbeat(self) -> None:
        _step_heartbeat(self.dispatch, self.token, **self.progress())

    def stored_response(self, step: int) -> LLMResponse | None:
        stored = self.stored.get(_key(self.dispatch, step))
        return LLMResponse.from_json(stored) if stored is not None else None

    def before_call(self) -> Finish | None:
        """Before a new model call (a stored step passed these checks when it was taken):
        the lease, then the wall clock and token budget from the agent's first start and
        first call, whatever deliveries came between."""
        self.heartbeat()
        limits = self.limits
        if self.tokens >= limits.agent_token_budget:
            return Finish(DispatchOutcome.BUDGET_EXCEEDED, _partial(
                self.last_text, self.messages, note=f"token budget of {limits.agent_token_budget} spent"))
        dispatch = self.dispatch
        if dispatch.deadline_at is not None and timezone.now() >= dispatch.deadline_at:
            # A Continue may have moved the deadline on since this delivery read it.
            dispatch.deadline_at = AgentDispatch.objects.values_list("deadline_at", flat=True).get(pk=dispatch.pk)
            if timezone.now() >= dispatch.deadline_at:
                return Finish(DispatchOutcome.TIMEOUT, _partial(self.last_text, self.messages),
                              f"wall-clock limit of {limits.agent_timeout_seconds:.0f}s reached")
        # The call is counted before it is made, against the turn's cap on agents' model
        # calls and the owner's allowance; either trips a pause (LimitTripped). A call
        # the allowance refuses is given back to the turn's count.
        agent_call_reserve(turn_id=dispatch.turn_id, limits=limits)
        if self.caps is None:
            self.caps = caps_for(self.user)  # read once a delivery; a Continue starts another
        try:
            self.reservation = spend_reserve(user=self.user, model=self.model, messages=self.messages,
                                             tools=self.tools, caps=self.caps)
        except LimitTripped:
            agent_call_release(turn_id=dispatch.turn_id)
            raise
        return None

    @property
    def model(self) -> str:
        return self.dispatch.model or settings.ASSISTANT_AGENT_MODEL

    def record_retry(self, retry: int, exc: LLMError, delay: float, step: int) -> None:
        dispatch = self.dispatch
        with transaction.atomic():
            heartbeat(AgentDispatch, dispatch.pk, self.token, retries=retry)
            event_record(
                type=AGENT_ATTEMPT, dispatch=dispatch,
                summary=f"{dispatch.agent_id} retry {retry} in {delay:.1f}s: {str(exc)[:120]}",
                payload={"sub_agent_id": dispatch.agent_id, "retry": retry, "step": step, "reason": str(exc),
                         "backoff_seconds": delay},
            )
        dispatch.retries = retry

    def store_and_act(self, step: int, response: LLMResponse, duration_ms: int) -> Finish | None:
        """Store a new response (before anything acts on it: a replay reuses it), then act.

        Its key is the agent's and the step's: a worker that lost its lease during the call
        finds the step stored by the agent's new holder, and stops."""
        dispatch = self.dispatch
        response = _unique_ids(response, self.messages, step)
        usage = response.usage
        cost = call_cost(response.model or dispatch.model, usage)
        spend_settle(reservation=self.reservation, usage=usage, cost=cost)
        try:
            LLMCall.objects.create(
                turn_id=dispatch.turn_id, dispatch=dispatch, key=_key(dispatch, step),
                model=response.model or dispatch.model, response=response.to_json(), duration_ms=duration_ms,
                prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens, cost_usd=cost,
            )
        except IntegrityError:
            raise LeaseLost(f"AgentDispatch {dispatch.pk}: step {step} stored by another worker") from None
        _step_heartbeat(dispatch, self.token)  # stopped during the call: no step shown, nothing run
        _record_step(dispatch, step, response, duration_ms)
        return self.act(step, response)

    def act(self, step: int, response: LLMResponse) -> Finish | None:
        """Take in the response: answer its tool calls, or see that the agent is done.
        None: ask the model again."""
        dispatch, limits, messages = self.dispatch, self.limits, self.messages
        seen = list(self.outside)  # what had reached the agent when the model wrote these calls
        self.usage = self.usage + response.usage
        self.llm_calls += 1
        messages.append(response.as_message())
        self.last_text = response.content or self.last_text
        if not response.tool_calls:
            if response.content.strip() and response.finish_reason != "length":
                return Finish(DispatchOutcome.COMPLETED, response.content)
            self.idle += 1
            if self.idle >= MAX_IDLE_REPLIES:
                return _idle_stop(self.idle, self.last_text, messages)
            messages.append({"role": "user", "content": "Your reply was empty or cut off. Reply with a short report."})
            return None
        dispatch_calls = [call for call in response.tool_calls if call.name == DISPATCH_AGENT]
        dispatched = (
            nesting.children_dispatch(dispatch=dispatch, token=self.token, calls=dispatch_calls, step=step,
                                      outside=seen)
            if self.delegates and dispatch_calls else {}
        )
        known = {USE_SKILL, DISPATCH_AGENT, GET_AGENT_RESULTS} if self.delegates else {USE_SKILL}
        self.idle = 0 if any(call.name in known for call in response.tool_calls) else self.idle + 1
        for call in response.tool_calls:
            if call.name in (DISPATCH_AGENT, GET_AGENT_RESULTS) and not self.delegates:
                content = error_json(nesting.refusal(dispatch, limits))
            elif call.name == DISPATCH_AGENT:
                content = dispatched[call.id]
            elif call.name == GET_AGENT_RESULTS:
                self.save_progress()  # the wait ends this delivery: the row has the run so far
                content = nesting.children_results(dispatch=dispatch, token=self.token, call=call, messages=messages)
                self.outside = lifecycle.merged(self.outside, *AgentDispatch.objects.filter(parent=dispatch).values_list(
                    "outside", flat=True))
            elif call.name != USE_SKILL:
                tools_text = ("the tools are use_skill, dispatch_agent and get_agent_results" if self.delegates
                              else "the only tool is use_skill")
                content = error_json(f"unknown tool {call.name!r}; {tools_text}.")
            elif self.used >= dispatch.max_tool_calls:
                content = error_json("tool budget spent; no more tool calls are possible.")
            else:
                self.used += 1
                content, outside = _use_skill(dispatch, self.token, self.user, call, seen)
                self.outside = lifecycle.merged(self.outside, outside)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if dispatch_calls:
            self.save_progress()  # a replay answers these calls from the transcript (nesting)
        if self.used >= dispatch.max_tool_calls:
            return Finish(DispatchOutcome.BUDGET_EXCEEDED, _partial(
                self.last_text, messages, note=f"tool budget of {dispatch.max_tool_calls} calls spent"))
        if self.idle >= MAX_IDLE_REPLIES:
            return _idle_stop(self.idle, self.last_text, messages)
        return None


    def save_progress(self) -> None:
        AgentDispatch.objects.filter(pk=self.dispatch.pk).update(**self.progress())


def _record_step(dispatch: AgentDispatch, step: int, response: LLMResponse, duration_ms: int) -> None:
    """The step in the timeline, and the agent's progress in the graph (its step count)."""
    skills = [_skill_named(call) for call in response.tool_calls]
    doing = ", ".join(skills) if skills else f"report ({response.finish_reason})"
    usage = response.usage
    event_record(
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


def _key(dispatch: AgentDispatch, step: int) -> str:
    return f"agent:{dispatch.pk}:s{step}"


def _idle_stop(idle: int, last_text: str, messages: list[dict]) -> Finish:
    return Finish(DispatchOutcome.FAILED, _partial(last_text, messages),
                  f"no usable reply from the model {idle} times in a row (empty, cut off, or unknown tools)")


def _stored_responses(dispatch: AgentDispatch) -> dict[str, dict]:
    """The responses earlier deliveries stored, by key."""
    return dict(LLMCall.objects.filter(dispatch=dispatch).values_list("key", "response"))


def _unique_ids(response: LLMResponse, messages: list[dict], step: int) -> LLMResponse:
    """Tool-call ids must be unique in the agent's history: they key its skill executions
    and children. Some servers number calls per response ('call_0' every time); renamed
    before the response is stored, so a replay sees the same ids."""
    used = {c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []}
    calls = []
    for index, call in enumerate(response.tool_calls):
        call_id = call.id or f"call_{step}_{index}"
        while call_id in used:
            call_id = f"{call_id}~{step}"
        used.add(call_id)
        calls.append(ToolCall(id=call_id, name=call.name, arguments=call.arguments))
    return replace(response, tool_calls=calls)


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
        # effect, even among one response's parallel calls.
        reserve_skill_call(dispatch=dispatch, skill=skill, arguments=skill_arguments, token=token)

    def after_run(skill: str, outcome: SkillOutcome) -> None:
        status = outcome.status if outcome.ok or outcome.status != "failed" else f"failed ({outcome.error_kind})"
        event_record(
            type=SKILL_FINISHED, dispatch=dispatch,
            summary=f"{dispatch.agent_id} ← {skill}: {status}",
            payload={"skill": skill, "status": outcome.status, "ok": outcome.ok, "error": outcome.error,
                     "error_kind": str(outcome.error_kind or ""), "duration_ms": outcome.duration_ms,
                     "execution_id": outcome.execution_id, "outside": list(outcome.outside)},
        )

    outcome = execute_skill(
        name=name, arguments=skill_arguments, user=user, tool_call_id=call.id,
        scope={"dispatch": dispatch}, granted=dispatch.skills, before_run=before_run, after_run=after_run,
        clear=approvals.gate(dispatch=dispatch, user=user, outside=seen), time_zone=dispatch.turn.time_zone,
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


@transaction.atomic
def _finish(dispatch: AgentDispatch, token: str, finish: Finish, *, progress: dict | None = None,
            usage: Usage = Usage()) -> None:
    """running → waiting_for_merge (or failed), with the run's `progress` (transcript,
    counters); the turn takes the agent's `usage`, and the scheduler takes it from there."""
    now = timezone.now()
    progress = progress or {}
    ok = finish.outcome in lifecycle.SUCCESS_OUTCOMES
    duration_ms = int((now - (dispatch.started_at or now)).total_seconds() * 1000)
    if not lifecycle.transition(
        dispatch.pk, source=DispatchState.RUNNING,
        target=DispatchState.WAITING_FOR_MERGE if ok else DispatchState.FAILED, where={"lease_token": token},
        outcome=finish.outcome, result=finish.result or finish.error, error=finish.error,
        finished_at=now, duration_ms=duration_ms, lease_token="", lease_expires_at=None, **progress,
    ):
        return
    tool_calls = progress.get("tool_calls_used", dispatch.tool_calls_used)
    if ok:
        event_record(type=AGENT_WAITING_FOR_MERGE, dispatch=dispatch,
                     summary=f"{dispatch.agent_id} finished ({finish.outcome}, {tool_calls} tool calls)",
                     payload={"sub_agent_id": dispatch.agent_id, "outcome": finish.outcome,
                              "result": finish.result[:4000], "tool_calls_used": tool_calls,
                              "duration_ms": duration_ms})
    else:
        event_record(type=AGENT_FAILED, dispatch=dispatch,
                     summary=f"{dispatch.agent_id} failed: {finish.error[:150]}",
                     payload={"sub_agent_id": dispatch.agent_id, "outcome": finish.outcome, "error": finish.error,
                              "duration_ms": duration_ms})
    lifecycle.turn_counter_add(dispatch.turn_id, prompt_tokens=usage.prompt_tokens,
                               completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens)
    lifecycle.dispatch_settle(turn_id=dispatch.turn_id, dispatch=dispatch)
