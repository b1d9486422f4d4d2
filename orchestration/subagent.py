"""The sub-agent loop (DESIGN.md §3–4): one django-q2 task per dispatch.

A fresh, short LLM loop: focused system prompt, the mission, its context and the results
of the agents it depends on, and only the scoped `use_skill` tool. Every model response
is stored (LLMCall) before its tools run and every skill call is keyed by
(dispatch, tool_call_id), so a delivery after a crash replays the stored steps and picks
up where the dead worker stopped, without asking the model or running a side effect twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from orchestration import dispatches as lifecycle
from orchestration import nesting
from orchestration.budget import reserve_skill_call
from orchestration.delegation import can_delegate
from orchestration.events import event_record
from orchestration.leases import LeaseLost, heartbeat, lease_until, new_token
from orchestration.limits import Limits, LimitTripped
from orchestration.llm import LLMError, LLMResponse, ToolCall, get_provider
from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, LLMCall, TurnStatus
from orchestration.pauses import turn_pause
from orchestration.prompts import agent_system_prompt, agent_task_message
from orchestration.toolcalls import error_json, load_json
from orchestration.tooldefs import DISPATCH_AGENT, GET_AGENT_RESULTS
from skills.executor import execute_skill
from skills.tools import use_skill_tool

logger = logging.getLogger(__name__)

USE_SKILL = "use_skill"
MAX_STEPS = 50  # a hard stop beyond the tool budget, for models that never call a tool
RETRY_BACKOFF_SECONDS = (1.0, 2.0, 4.0)


class Cancelled(Exception):
    """The turn ended or was stopped: the agent stops at its next step."""


class Paused(Exception):
    """The turn paused on a limit: the agent goes back to `created` and resumes later."""


@dataclass
class Finish:
    outcome: str
    result: str
    error: str = ""


def subagent_run(*, dispatch_id: int) -> None:
    token = _claim(dispatch_id)
    if token is None:
        return
    dispatch = AgentDispatch.objects.select_related("turn__conversation__owner", "profile").get(pk=dispatch_id)
    limits = Limits.from_json(dispatch.turn.limits)
    while True:
        try:
            finish = _loop(dispatch, token, limits)
        except LeaseLost:
            logger.info("Dispatch %s: lease lost; another worker continues", dispatch_id)
            return
        except Cancelled:
            lifecycle.dispatch_close(dispatch, outcome=DispatchOutcome.CANCELLED, reason="cancelled")
            return
        except Paused:
            _release(dispatch, token)
            return
        except nesting.WaitForChildren:
            return  # back in `created`; the agent finishing last wakes it
        except LimitTripped as trip:
            _release(dispatch, token)
            turn_pause(turn_id=dispatch.turn_id, trip=trip)
            return
        except LLMError as exc:
            if exc.transient and dispatch.retries < limits.agent_max_retries:
                dispatch = _next_attempt(dispatch, token, exc)
                continue
            finish = Finish(DispatchOutcome.FAILED, "", f"LLM error: {exc}")
        except Exception as exc:
            logger.exception("Dispatch %s failed", dispatch_id)
            finish = Finish(DispatchOutcome.FAILED, "", f"{type(exc).__name__}: {exc}")
        _finish(dispatch, token, finish)
        return


def _claim(dispatch_id: int) -> str | None:
    token = new_token()
    now = timezone.now()
    awaited = AgentDispatch.objects.filter(pk=dispatch_id).values_list("awaiting", flat=True).first()
    claimed = AgentDispatch.objects.filter(pk=dispatch_id, state=DispatchState.CREATED).update(
        state=DispatchState.RUNNING, lease_token=token, lease_expires_at=lease_until(),
        heartbeat_at=now, queued_at=None, attempts=F("attempts") + 1, awaiting={},
    )
    if not claimed:
        return None
    dispatch = AgentDispatch.objects.select_related("turn").get(pk=dispatch_id)
    with transaction.atomic():
        if dispatch.started_at is None:
            AgentDispatch.objects.filter(pk=dispatch_id).update(started_at=now)
            event_record(type="agent.subagent_started", dispatch=dispatch, summary=f"{dispatch.agent_id} started",
                         payload={"sub_agent_id": dispatch.agent_id, "attempt": dispatch.attempts})
        else:
            reason = "its agents finished" if awaited else "redelivered"
            event_record(type="agent.subagent_attempt", dispatch=dispatch,
                         summary=f"{dispatch.agent_id} resumed ({reason})",
                         payload={"sub_agent_id": dispatch.agent_id, "attempt": dispatch.attempts, "reason": reason,
                                  "awaited": (awaited or {}).get("agent_ids", [])})
    return token


def _release(dispatch: AgentDispatch, token: str) -> None:
    """Back to `created`: Continue starts it again and the replay skips finished steps."""
    AgentDispatch.objects.filter(pk=dispatch.pk, lease_token=token).update(
        state=DispatchState.CREATED, lease_token="", lease_expires_at=None
    )


def _next_attempt(dispatch: AgentDispatch, token: str, exc: LLMError) -> AgentDispatch:
    retry = dispatch.retries + 1
    delay = RETRY_BACKOFF_SECONDS[min(retry - 1, len(RETRY_BACKOFF_SECONDS) - 1)]
    with transaction.atomic():
        heartbeat(AgentDispatch, dispatch.pk, token, retries=retry)
        event_record(
            type="agent.subagent_attempt", dispatch=dispatch,
            summary=f"{dispatch.agent_id} retry {retry} in {delay:.0f}s: {str(exc)[:120]}",
            payload={"sub_agent_id": dispatch.agent_id, "retry": retry, "reason": str(exc), "backoff_seconds": delay},
        )
    time.sleep(delay)
    dispatch.refresh_from_db()
    return dispatch


def _step_heartbeat(dispatch: AgentDispatch, token: str) -> None:
    """Before each step: renew the lease if the agent may go on, in one UPDATE.

    Otherwise say why: the turn paused (Paused), ended or the agent was stopped
    (Cancelled), or the reaper gave the agent to another worker (LeaseLost)."""
    live = AgentDispatch.objects.filter(
        pk=dispatch.pk, lease_token=token, state=DispatchState.RUNNING,
        turn__status__in=[TurnStatus.RUNNING, TurnStatus.WAITING],
    )
    if live.update(lease_expires_at=lease_until(), heartbeat_at=timezone.now()):
        return
    state, status = AgentDispatch.objects.values_list("state", "turn__status").get(pk=dispatch.pk)
    if status == TurnStatus.PAUSED:
        raise Paused()
    if status not in (TurnStatus.RUNNING, TurnStatus.WAITING) or state != DispatchState.RUNNING:
        raise Cancelled()
    raise LeaseLost(f"AgentDispatch {dispatch.pk}: lease lost")


def _loop(dispatch: AgentDispatch, token: str, limits: Limits) -> Finish:
    provider = get_provider()
    user = dispatch.turn.conversation.owner
    delegates = can_delegate(dispatch, limits)
    tools = [use_skill_tool(dispatch.skills)] + (nesting.tools_for(dispatch, limits) if delegates else [])
    profile_prompt = dispatch.profile.system_prompt if dispatch.profile else ""
    messages = [
        {"role": "system", "content": agent_system_prompt(profile_prompt=profile_prompt, delegates=delegates)},
        {"role": "user", "content": agent_task_message(
            mission=dispatch.mission, context=dispatch.context, prior_results=_prior_results(dispatch))},
    ]
    deadline = time.monotonic() + limits.agent_timeout_seconds
    tokens = used = 0
    last_text = ""
    stored = _stored_responses(dispatch)
    for step in range(MAX_STEPS):
        _step_heartbeat(dispatch, token)
        if time.monotonic() > deadline:
            return Finish(DispatchOutcome.TIMEOUT, _partial(last_text, messages),
                          f"wall-clock limit of {limits.agent_timeout_seconds:.0f}s reached")
        if tokens >= limits.agent_token_budget:
            return Finish(DispatchOutcome.BUDGET_EXCEEDED,
                          _partial(last_text, messages, note=f"token budget of {limits.agent_token_budget} spent"))
        response = _stored_or_asked(dispatch, token, step, stored, provider, messages, tools)
        tokens += response.usage.prompt_tokens + response.usage.completion_tokens
        messages.append(response.as_message())
        last_text = response.content or last_text
        if not response.tool_calls:
            if response.content.strip() and response.finish_reason != "length":
                _save_progress(dispatch, used, messages)
                return Finish(DispatchOutcome.COMPLETED, response.content)
            messages.append({"role": "user", "content": "Your reply was empty or cut off. Reply with a short report."})
            continue
        dispatch_calls = [call for call in response.tool_calls if call.name == DISPATCH_AGENT]
        dispatched = (
            nesting.children_dispatch(dispatch=dispatch, token=token, calls=dispatch_calls, step=step)
            if delegates and dispatch_calls else {}
        )
        for call in response.tool_calls:
            if call.name in (DISPATCH_AGENT, GET_AGENT_RESULTS) and not delegates:
                content = error_json(nesting.refusal(dispatch, limits))
            elif call.name == DISPATCH_AGENT:
                content = dispatched[call.id]
            elif call.name == GET_AGENT_RESULTS:
                _save_progress(dispatch, used, messages)
                content = nesting.children_results(dispatch=dispatch, token=token, call=call, messages=messages)
            elif call.name != USE_SKILL:
                tools_text = ("the tools are use_skill, dispatch_agent and get_agent_results" if delegates
                              else "the only tool is use_skill")
                content = error_json(f"unknown tool {call.name!r}; {tools_text}.")
            elif used >= dispatch.max_tool_calls:
                content = error_json("tool budget spent; no more tool calls are possible.")
            else:
                used += 1
                content = _use_skill(dispatch, token, user, call)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        _save_progress(dispatch, used, messages)
        if used >= dispatch.max_tool_calls:
            return Finish(DispatchOutcome.BUDGET_EXCEEDED, _partial(
                last_text, messages, note=f"tool budget of {dispatch.max_tool_calls} calls spent"))
    return Finish(DispatchOutcome.FAILED, _partial(last_text, messages), f"no report after {MAX_STEPS} steps")


def _stored_responses(dispatch: AgentDispatch) -> dict[str, dict]:
    """The responses earlier deliveries stored, by key (`llm_calls` counts them: it is
    incremented in the transaction that stores one)."""
    if not dispatch.llm_calls:
        return {}
    return dict(LLMCall.objects.filter(dispatch=dispatch).values_list("key", "response"))


def _stored_or_asked(dispatch, token, step, stored, provider, messages, tools) -> LLMResponse:
    key = f"agent:{dispatch.pk}:r{dispatch.retries}:s{step}"
    if key in stored:
        return LLMResponse.from_json(stored[key])
    started = time.monotonic()
    response = provider.complete(model=dispatch.model, messages=messages, tools=tools)
    duration_ms = int((time.monotonic() - started) * 1000)
    response = _unique_ids(response, messages, step)
    usage = {"prompt_tokens": response.usage.prompt_tokens, "completion_tokens": response.usage.completion_tokens,
             "cached_tokens": response.usage.cached_tokens}
    with transaction.atomic():
        heartbeat(AgentDispatch, dispatch.pk, token, llm_calls=F("llm_calls") + 1,
                  **{k: F(k) + v for k, v in usage.items()})
        LLMCall.objects.create(turn_id=dispatch.turn_id, dispatch=dispatch, key=key, model=response.model or dispatch.model,
                               response=response.to_json(), duration_ms=duration_ms, **usage)
        lifecycle.turn_counter_add(dispatch.turn_id, **usage)
    return response


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


def _use_skill(dispatch: AgentDispatch, token: str, user, call) -> str:
    arguments, error = load_json(call.arguments)
    if error:
        return error_json(f"{error}; send {{\"skill\": ..., \"arguments\": {{...}}}}.")
    if not isinstance(arguments, dict) or not isinstance(arguments.get("skill"), str):
        return error_json('use_skill needs {"skill": "<name>", "arguments": {...}}.')
    name, skill_arguments = arguments["skill"], arguments.get("arguments", {})

    def before_run() -> None:
        # In the transaction that opens the skill's row, just before its handler: a
        # dispatch cancelled (or reaped) since this step began runs no further side
        # effect, even among one response's parallel calls.
        heartbeat(AgentDispatch, dispatch.pk, token)
        reserve_skill_call(dispatch=dispatch, skill=name, arguments=skill_arguments)

    outcome = execute_skill(
        name=name, arguments=skill_arguments, user=user, tool_call_id=call.id,
        scope={"dispatch": dispatch}, granted=dispatch.skills, before_run=before_run,
    )
    if not outcome.replayed:
        status = outcome.status if outcome.ok or outcome.status != "failed" else f"failed ({outcome.error_kind})"
        event_record(
            type="skill.finished", dispatch=dispatch,
            summary=f"{dispatch.agent_id} ← {name}: {status}",
            payload={"skill": name, "status": outcome.status, "ok": outcome.ok, "error": outcome.error,
                     "error_kind": str(outcome.error_kind or ""), "duration_ms": outcome.duration_ms,
                     "execution_id": outcome.execution_id},
        )
    return outcome.as_tool_content()


def _save_progress(dispatch: AgentDispatch, used: int, messages: list[dict]) -> None:
    AgentDispatch.objects.filter(pk=dispatch.pk).update(tool_calls_used=used, transcript=messages[1:])
    dispatch.tool_calls_used = used


def _prior_results(dispatch: AgentDispatch) -> list[dict]:
    if not dispatch.depends_on:
        return []
    deps = AgentDispatch.objects.filter(turn_id=dispatch.turn_id, agent_id__in=dispatch.depends_on)
    return [{"agent_id": d.agent_id, "status": lifecycle.result_status(d), "result": d.result} for d in deps]


def _partial(last_text: str, messages: list[dict], *, note: str = "") -> str:
    results = [m["content"] for m in messages if m.get("role") == "tool"][-3:]
    parts = [f"({note}; partial result)"] if note else []
    if last_text:
        parts.append(last_text)
    if results:
        parts.append("Last tool results:\n" + "\n".join(r[:800] for r in results))
    return "\n".join(parts) or "No result."


def _finish(dispatch: AgentDispatch, token: str, finish: Finish) -> None:
    now = timezone.now()
    ok = finish.outcome in lifecycle.SUCCESS_OUTCOMES
    state = DispatchState.WAITING_FOR_MERGE if ok else DispatchState.FAILED
    dispatch.refresh_from_db()
    started = dispatch.started_at or now
    duration_ms = int((now - started).total_seconds() * 1000)
    with transaction.atomic():
        updated = AgentDispatch.objects.filter(pk=dispatch.pk, lease_token=token, state=DispatchState.RUNNING).update(
            state=state, outcome=finish.outcome, result=finish.result or finish.error, error=finish.error,
            finished_at=now, duration_ms=duration_ms, lease_token="", lease_expires_at=None,
        )
        if not updated:
            return
        dispatch.refresh_from_db()
        if ok:
            event_record(type="agent.subagent_waiting_for_merge", dispatch=dispatch,
                         summary=f"{dispatch.agent_id} finished ({finish.outcome}, {dispatch.tool_calls_used} tool calls)",
                         payload={"sub_agent_id": dispatch.agent_id, "outcome": finish.outcome,
                                  "result": finish.result[:4000], "tool_calls_used": dispatch.tool_calls_used,
                                  "duration_ms": duration_ms})
        else:
            event_record(type="agent.subagent_failed", dispatch=dispatch,
                         summary=f"{dispatch.agent_id} failed: {finish.error[:150]}",
                         payload={"sub_agent_id": dispatch.agent_id, "outcome": finish.outcome, "error": finish.error,
                                  "duration_ms": duration_ms})
        lifecycle.dispatch_settle(turn_id=dispatch.turn_id, dispatch_id=dispatch.pk)
