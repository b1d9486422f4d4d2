"""The orchestrator step (DESIGN.md §3–4), a runner job (orchestration/runner.py).

One step claims the turn, then loops: answer pending tool calls, or ask the model. Each
pass ends in one of three ways — the turn is answered, it waits for agents (the lease
is released, no worker is held; the agent finishing last wakes it), or it goes round
again. The loop is bounded by the turn's LLM-iteration limit and by MAX_PASSES. Only the
model call is awaited on the runner's loop; the rest of a pass is one `db` call.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from orchestration import dispatches as lifecycle
from orchestration.budgets.limits import Limits, LimitTripped
from orchestration.budgets.pricing import call_cost
from orchestration.budgets.spending import Reservation, spend_release, spend_reserve, spend_settle
from orchestration.delegation import (
    dispatch_create,
    dispatch_result_json,
    plan_batch,
    profiles_by_name,
    reserve_agents,
)
from orchestration.leases import LeaseLost, heartbeat, lease_until, new_token
from orchestration.llm import LLMError, LLMResponse, ToolCall, get_provider
from orchestration.llm.base import tool_call_message
from orchestration.models import LLMCall, Message, Turn, TurnStatus
from orchestration.prompts import orchestrator_system_prompt, user_local_time
from orchestration import runner
from orchestration.questions.pauses import turn_pause
from orchestration.records.catalogue import ORCHESTRATOR_LLM_CALL, ORCHESTRATOR_LLM_RETRY
from orchestration.records.events import event_record
from orchestration.records.history import llm_messages, message_append, messages_append, pending_tool_calls
from orchestration.records.output import output_limit, text_bounded
from orchestration.retries import complete_retrying
from orchestration.runner import HandBack, db
from orchestration.tasks import enqueue_orchestrator_step
from orchestration.toolcalls import error_json, parse_arguments
from orchestration.tooldefs import (
    DISPATCH_AGENT,
    GET_AGENT_RESULTS,
    GET_SKILL,
    ORCHESTRATOR_TOOL_NAMES,
    get_agent_results_parameters,
    get_skill_parameters,
    orchestrator_tools,
)
from orchestration.turns import turn_complete, turn_draft_save, turn_fail
from skills.registry import catalogue, get_skill_tool_result

logger = logging.getLogger(__name__)

MAX_PASSES = 100
WAIT = "wait"
AGAIN = "again"


async def orchestrator_run(turn_id: int) -> None:
    token = await db(_claim, turn_id)
    if token is None:
        return  # another worker has it, or the turn is not running
    try:
        await _run(turn_id, token)
    except LeaseLost:
        logger.info("Turn %s: lease lost; another worker continues", turn_id)
    except HandBack:
        await db(_requeue, turn_id, token)
    except LimitTripped as trip:
        await db(turn_pause, turn_id=turn_id, trip=trip, token=token)
    except LLMError as exc:
        await db(turn_fail, turn_id=turn_id, error=f"The model could not be reached: {exc}", token=token)
    except Exception as exc:  # a bug or a broken dependency: never an endless retry
        logger.exception("Turn %s: orchestrator step failed", turn_id)
        await db(_retry_or_fail, turn_id, token, exc)


def _claim(turn_id: int) -> str | None:
    token = new_token()
    now = timezone.now()
    claimed = (
        Turn.objects.filter(pk=turn_id, status=TurnStatus.RUNNING)
        .exclude(lease_expires_at__gt=now)
        .update(lease_token=token, lease_expires_at=lease_until(), queued_at=None,
                step_attempts=F("step_attempts") + 1)
    )
    return token if claimed else None


def _retry_or_fail(turn_id: int, token: str, exc: Exception) -> None:
    turn = Turn.objects.get(pk=turn_id)
    if turn.step_attempts >= settings.ASSISTANT_MAX_STEP_ATTEMPTS:
        turn_fail(
            turn_id=turn_id,
            token=token,
            error=f"The orchestrator step failed {turn.step_attempts} times; giving up "
            f"(dead-lettered). Last error: {exc}",
        )
        return
    _requeue(turn_id, token)


@transaction.atomic
def _requeue(turn_id: int, token: str) -> None:
    """Give the step back to the queue (a later delivery, or another process)."""
    if Turn.objects.filter(pk=turn_id, lease_token=token).update(lease_token="", lease_expires_at=None):
        enqueue_orchestrator_step(turn_id)


async def _run(turn_id: int, token: str) -> None:
    provider = get_provider()
    for _ in range(MAX_PASSES):
        request = await db(_next_request, turn_id, token)
        if request is None:
            return
        try:
            response, duration_ms = await _ask(request, token, provider)
        except Exception:
            await db(spend_release, reservation=request.reservation)
            raise
        await db(_settle_and_record, request, token, response, duration_ms)
    raise RuntimeError(f"turn {turn_id}: no progress after {MAX_PASSES} passes")


@dataclass(frozen=True, kw_only=True)
class _Request:
    """What the next model call asks, with the turn it is for."""

    turn: Turn
    iteration: int
    model: str
    messages: list[dict]
    tools: list[dict]
    limits: Limits
    reservation: Reservation | None = None  # from the owner's allowance (orchestration/budgets/spending.py)


def _next_request(turn_id: int, token: str) -> _Request | None:
    """Answer what can be answered without the model; then either the turn is done or
    waits (None), or here is what to ask the model."""
    while True:
        if runner.handing_back():
            raise HandBack()
        turn = Turn.objects.select_related("conversation__owner").get(pk=turn_id)
        if turn.status != TurnStatus.RUNNING or turn.lease_token != token:
            return None
        assistant, pending = pending_tool_calls(turn)
        if pending:
            if _answer_tool_calls(turn, token, pending) == WAIT:
                return None
            continue
        if assistant is not None and assistant.seq == _last_seq(turn) and assistant.content:
            turn_complete(turn_id=turn_id, token=token, answer=assistant)
            return None
        limits = Limits.from_json(turn.limits)
        if turn.llm_iterations >= limits.turn_max_llm_iterations:
            raise LimitTripped(
                "turn_max_llm_iterations",
                f"The orchestrator used its {limits.turn_max_llm_iterations} LLM iterations "
                "for this turn without a final answer.",
                detail={"limit": limits.turn_max_llm_iterations, "used": turn.llm_iterations},
            )
        request = _request_for(turn, limits)
        # Reserved before the call is made; a call the allowance cannot cover pauses the turn.
        return replace(request, reservation=spend_reserve(
            user=turn.conversation.owner, model=request.model, messages=request.messages, tools=request.tools))


def _last_seq(turn: Turn) -> int:
    """The last message the model can see (notices to the user do not count)."""
    seen = turn.messages.exclude(role=Message.Role.NOTICE)
    return seen.order_by("-seq").values_list("seq", flat=True).first() or 0


def _request_for(turn: Turn, limits: Limits) -> _Request:
    profiles = profiles_by_name()
    prompt = orchestrator_system_prompt(
        catalogue=catalogue(), profiles=[{"name": p.name, "description": p.description} for p in profiles.values()],
        local_time=user_local_time(turn),
    )
    tools = orchestrator_tools(
        profile_names=list(profiles), max_tool_calls_cap=limits.agent_max_tool_calls_cap
    )
    return _Request(turn=turn, iteration=turn.llm_iterations + 1, model=settings.ASSISTANT_ORCHESTRATOR_MODEL,
                    messages=llm_messages(turn=turn, system_prompt=prompt), tools=tools, limits=limits)


async def _ask(request: _Request, token: str, provider) -> tuple[LLMResponse, int]:
    async def before_retry(retry: int, exc: LLMError, delay: float) -> None:
        await db(_record_retry, request, token, retry, exc, delay)
        await asyncio.sleep(delay)
        await db(heartbeat, Turn, request.turn.pk, token)  # stopped meanwhile: the lease is gone, no further call

    return await complete_retrying(
        lambda: provider.acomplete(model=request.model, messages=request.messages, tools=request.tools,
                                   on_text=_DraftWriter(request.turn, token),
                                   max_tokens=request.reservation.max_tokens),
        used=request.turn.llm_retries, allowed=request.limits.orchestrator_max_retries, before_retry=before_retry,
    )


class _DraftWriter:
    """Receives the answer as it streams and stores it for the page, at most once every
    ASSISTANT_STREAM_INTERVAL_SECONDS: the page follows a few times a second, however
    fast the tokens come. What arrives after the last write is in the stored answer,
    which `_record` writes at once."""

    def __init__(self, turn: Turn, token: str):
        self.turn, self.token = turn, token
        self.written_at = float("-inf")

    async def __call__(self, text: str) -> None:
        now = asyncio.get_running_loop().time()
        if now - self.written_at >= settings.ASSISTANT_STREAM_INTERVAL_SECONDS:
            self.written_at = now
            await db(turn_draft_save, turn=self.turn, token=self.token, text=text)


@transaction.atomic
def _record_retry(request: _Request, token: str, retry: int, exc: LLMError, delay: float) -> None:
    heartbeat(Turn, request.turn.pk, token, llm_retries=retry, answer_draft="")
    event_record(
        type=ORCHESTRATOR_LLM_RETRY, turn=request.turn,
        summary=f"Orchestrator call {request.iteration}: retry {retry} in {delay:.1f}s: {str(exc)[:120]}",
        payload={"iteration": request.iteration, "retry": retry, "reason": str(exc), "backoff_seconds": delay},
    )


def _settle_and_record(request: _Request, token: str, response: LLMResponse, duration_ms: int) -> None:
    """The call counts at what it used (its own transaction: even if storing it fails),
    then it is stored."""
    spend_settle(reservation=request.reservation, usage=response.usage,
                 cost=call_cost(response.model or request.model, response.usage))
    _record(request, token, response, duration_ms)


@transaction.atomic
def _record(request: _Request, token: str, response: LLMResponse, duration_ms: int) -> None:
    """Store the response, its (uniquely named) tool calls and its event, or nothing."""
    turn, iteration, model = request.turn, request.iteration, request.model
    calls = _unique_ids(turn, response.tool_calls)
    heartbeat(Turn, turn.pk, token)
    LLMCall.objects.create(
        turn=turn, key=f"orchestrator:{iteration}", model=response.model or model,
        response=response.to_json(), duration_ms=duration_ms, **_usage(response),
        cost_usd=call_cost(response.model or model, response.usage),
    )
    Turn.objects.filter(pk=turn.pk).update(
        llm_iterations=F("llm_iterations") + 1, answer_draft="",  # the draft is a message now
        **{k: F(k) + v for k, v in _usage(response).items()},
    )
    message_append(  # the whole response is in the LLMCall above; the chat keeps a bounded copy
        turn=turn, role=Message.Role.ASSISTANT,
        content=text_bounded(response.content, limit=output_limit("answer_chars")),
        tool_calls=[tool_call_message(call) for call in calls],
    )
    problem = _response_problem(response, calls)
    if problem:
        message_append(turn=turn, role=Message.Role.NOTE, content=problem)
    event_record(
        type=ORCHESTRATOR_LLM_CALL,
        turn=turn,
        summary=_llm_summary(iteration, response, calls),
        payload={
            "iteration": iteration, "model": response.model or model, "duration_ms": duration_ms,
            "finish_reason": response.finish_reason, "usage": _usage(response),
            "tool_calls": [{"name": c.name, "arguments": c.arguments[:2000]} for c in calls],
            "content": response.content[:2000],
        },
    )


def _response_problem(response: LLMResponse, calls: list[ToolCall]) -> str:
    """A note back to the model when its reply cannot be used as it is."""
    if calls:
        return ""
    if response.finish_reason == "length":
        return "Your reply was cut off (finish_reason=length). Reply again, more briefly."
    if not response.content.strip():
        return "Your reply was empty. Call a tool or answer the user."
    return ""


def _unique_ids(turn: Turn, calls: list[ToolCall]) -> list[ToolCall]:
    """Tool-call ids must be unique in the turn; some servers reuse 'call_1'."""
    used = set(turn.messages.exclude(tool_call_id="").values_list("tool_call_id", flat=True))
    for message in turn.messages.exclude(tool_calls=[]):
        used.update(call["id"] for call in message.tool_calls)
    unique = []
    for index, call in enumerate(calls):
        call_id = call.id or f"call_{index}"
        while call_id in used:
            call_id = f"{call_id}~{turn.llm_iterations + 1}"
        used.add(call_id)
        unique.append(ToolCall(id=call_id, name=call.name, arguments=call.arguments))
    return unique


def _usage(response: LLMResponse) -> dict:
    return {
        "prompt_tokens": response.usage.prompt_tokens,
        "completion_tokens": response.usage.completion_tokens,
        "cached_tokens": response.usage.cached_tokens,
    }


def _llm_summary(iteration: int, response: LLMResponse, calls: list[ToolCall]) -> str:
    if calls:
        names = ", ".join(call.name for call in calls)
        return f"Orchestrator call {iteration}: {names}"
    return f"Orchestrator call {iteration}: answer ({response.finish_reason})"


# --- tool calls -------------------------------------------------------------------------


def _answer_tool_calls(turn: Turn, token: str, pending: list[dict]) -> str:
    calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]) for c in pending]
    dispatch_calls = [call for call in calls if call.name == DISPATCH_AGENT]
    if dispatch_calls:
        _dispatch_batch(turn, token, dispatch_calls)
    for call in calls:
        if call.name == DISPATCH_AGENT:
            continue
        if call.name == GET_AGENT_RESULTS:
            if _agent_results(turn, token, call) == WAIT:
                return WAIT
            continue
        if call.name == GET_SKILL:
            content = _get_skill(call)
        else:
            content = error_json(
                f"unknown tool {call.name!r}; the tools are {', '.join(ORCHESTRATOR_TOOL_NAMES)}."
            )
        with transaction.atomic():
            heartbeat(Turn, turn.pk, token)
            message_append(turn=turn, role=Message.Role.TOOL, content=content, tool_call_id=call.id)
    return AGAIN


def _get_skill(call: ToolCall) -> str:
    arguments, error = parse_arguments(call.arguments, get_skill_parameters())
    if error:
        return error_json(error)
    return json.dumps(get_skill_tool_result(arguments.get("domain")))


def _dispatch_batch(turn: Turn, token: str, calls: list[ToolCall]) -> None:
    task_prompt = turn.messages.filter(role=Message.Role.USER).values_list("content", flat=True).first() or ""
    with transaction.atomic():
        turn = lifecycle.lock_turn(turn.pk)
        heartbeat(Turn, turn.pk, token)
        planned = plan_batch(turn=turn, calls=calls)
        reserve_agents(turn=turn, agent_ids=[item.spec["agent_id"] for item in planned if not item.error])
        answers = []
        for item in planned:
            if item.error:
                content = error_json(item.error, agent_id=item.spec.get("agent_id"))
            else:
                dispatch_create(turn=turn, item=item, task_prompt=task_prompt)
                content = dispatch_result_json(item.spec["agent_id"])
            answers.append({"role": Message.Role.TOOL, "content": content, "tool_call_id": item.call.id})
        messages_append(turn=turn, messages=answers)
        lifecycle.dispatch_schedule(turn)


def _agent_results(turn: Turn, token: str, call: ToolCall) -> str:
    arguments, error = parse_arguments(call.arguments, get_agent_results_parameters())
    if error:
        with transaction.atomic():
            heartbeat(Turn, turn.pk, token)
            message_append(turn=turn, role=Message.Role.TOOL, content=error_json(error), tool_call_id=call.id)
        return AGAIN
    with transaction.atomic():
        turn = lifecycle.lock_turn(turn.pk)
        heartbeat(Turn, turn.pk, token)
        # Only the orchestrator's own agents: a nested agent reports to its parent.
        top_level = turn.dispatches.filter(parent__isnull=True)
        names = arguments.get("agent_ids") or list(top_level.values_list("agent_id", flat=True))
        found = {d.agent_id: d for d in top_level.filter(agent_id__in=names)}
        if any(not lifecycle.is_terminal(d) for d in found.values()):
            Turn.objects.filter(pk=turn.pk, lease_token=token).update(
                status=TurnStatus.WAITING, awaiting={"tool_call_id": call.id, "agent_ids": sorted(found)},
                lease_token="", lease_expires_at=None, step_attempts=0,
            )
            return WAIT
        results = lifecycle.dispatch_results_collect(names, found)
        message_append(turn=turn, role=Message.Role.TOOL, content=json.dumps(results), tool_call_id=call.id)
        # What the orchestrator has now read reaches every agent it dispatches from here on.
        outside = lifecycle.merged(turn.outside, *(d.outside for d in found.values()))
        Turn.objects.filter(pk=turn.pk).update(awaiting={}, outside=outside)
    return AGAIN
