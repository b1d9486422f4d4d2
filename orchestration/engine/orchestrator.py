"""The orchestrator's role in the step machine (engine/loop.py; DESIGN.md §3–4).

Its run is the turn: the conversation's history is its transcript, so a replay is the
history itself. Its stored answer for the last step is the last assistant message; acting
on it answers its pending tool calls (get_skill, dispatch_agent, get_agent_results),
which may make the turn wait for its agents (released; the agent finishing last wakes
it), or sees that it answered the user.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from orchestration.budgets.limits import Limits, LimitTripped
from orchestration.budgets.pricing import call_cost
from orchestration.budgets.spending import SpendMeter
from orchestration.delivery import runner
from orchestration.delivery.dbretry import is_transient
from orchestration.delivery.leases import VERIFIED_SECONDS, LeaseLost, lease_until, new_token
from orchestration.engine import steps
from orchestration.engine.delegation import dispatch_batch, dispatch_result_json, profiles_by_name, skill_domains
from orchestration.engine.prompts import orchestrator_system_prompt, user_local_time
from orchestration.engine.steps import Next
from orchestration.engine.toolcalls import error_json, parse_arguments
from orchestration.engine.tooldefs import (
    DISPATCH_AGENT,
    GET_AGENT_RESULTS,
    GET_SKILL,
    ORCHESTRATOR_TOOL_NAMES,
    get_agent_results_parameters,
    get_skill_parameters,
    orchestrator_tools,
)
from orchestration.engine.toolids import unique_ids
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.lifecycle.turns import turn_complete, turn_draft_save, turn_fail
from orchestration.llm import LLMError, LLMResponse, ToolCall, capacity, get_provider
from orchestration.llm.base import tool_call_message
from orchestration.models import AgentDispatch, LLMCall, Message, Turn, TurnStatus
from orchestration.questions.pauses import turn_pause
from orchestration.records.catalogue import LLM_WAITING, ORCHESTRATOR_LLM_CALL, ORCHESTRATOR_LLM_RETRY
from orchestration.records.compiled import CompiledRead, CompiledUpdate, attnames, related_attnames
from orchestration.records.events import event_record
from orchestration.records.history import llm_messages, message_append, messages_append, pending_tool_calls
from orchestration.records.inserts import llm_call_record
from orchestration.records.output import output_limit, text_bounded
from skills.registry import catalogue, get_skill_tool_result

logger = logging.getLogger(__name__)

# The stored answer of a step the history already holds (acting reads the history).
STORED = LLMResponse(content="", tool_calls=[], finish_reason="stored")


# Read with every results call: compiled once (orchestration/records/compiled.py).
_top_level_agents = CompiledRead(lambda turn_id: AgentDispatch.objects.filter(
    turn_id=turn_id, parent__isnull=True).values_list(*attnames(AgentDispatch)))


# Each delivery's load, each check and each stored answer: compiled once.
_turn_read = CompiledRead(lambda turn_id: Turn.objects.filter(pk=turn_id).order_by().values_list(
    *attnames(Turn), *related_attnames(Turn, "conversation"), *related_attnames(Turn, "conversation__owner")))
_claiming = CompiledUpdate(lambda p: (Turn.objects.filter(pk=p.pk, status=TurnStatus.RUNNING, lease_token=""),
                                      {"lease_token": p.token, "lease_expires_at": p.until, "queued_at": None}))
_task_prompt = CompiledRead(lambda turn_id: Message.objects.filter(turn_id=turn_id, role=Message.Role.USER)
                            .order_by("seq").values_list("content")[:1])
_lease_renewing = CompiledUpdate(lambda p: (
    Turn.objects.filter(pk=p.pk, lease_token=p.token, status=TurnStatus.RUNNING), {"lease_expires_at": p.until}))
_answer_counting = CompiledUpdate(lambda p: (Turn.objects.filter(pk=p.pk, lease_token=p.token), {
    "lease_expires_at": p.until, "llm_iterations": F("llm_iterations") + 1, "answer_draft": "",
    **{name: F(name) + p[name] for name in ("prompt_tokens", "completion_tokens", "cached_tokens")}}))


class Orchestrator:
    def __init__(self, turn_id: int, token: str):
        self.turn_id, self.token = turn_id, token
        self.label = f"turn {turn_id}"
        self.provider = get_provider()
        self.turn: Turn | None = None
        self.limits: Limits | None = None
        self.first_step = 0
        self.spend: SpendMeter | None = None  # made at load, kept across reloads
        self.call: dict = {}
        self.profiles: dict | None = None
        self.verified_at = float("-inf")  # when the lease was last found ours (time.monotonic)
        # The answer this delivery has just stored, as acting needs it (its message, its
        # tool calls, and whether a note followed it): no read of the history back.
        self.stored: tuple[Message, list[dict], bool] | None = None

    # --- claim and replay ---------------------------------------------------------------

    @classmethod
    def claim(cls, turn_id: int) -> Orchestrator | None:
        """Take the turn if it runs and nobody holds it (a dead holder's lease is the
        reaper's to clear: that is how crashes are counted)."""
        token = new_token()
        if not _claiming(pk=turn_id, token=token, until=lease_until()):
            return None
        orchestrator = cls(turn_id, token)
        orchestrator.verified_at = time.monotonic()  # its lease just taken: the first call need not ask again
        return orchestrator

    @classmethod
    def adopt_many(cls, claimed: list) -> dict[int, Orchestrator]:
        """Turns claimed for this runner by the UPDATE that woke them (their last agent's
        end: lifecycle.orchestrator_wake_if_ready): nothing to read or write."""
        adopted = {}
        for item in claimed:
            adopted[item.item_id] = orchestrator = cls(item.item_id, item.token)
            orchestrator.verified_at = time.monotonic()
        return adopted

    def load(self) -> None:
        self.stored = None
        found = _turn_read.instances(Turn, self.turn_id)
        if not found:
            raise Turn.DoesNotExist(f"no turn {self.turn_id}")
        self.turn = found[0]
        self.limits = Limits.from_json(self.turn.limits)
        self.spend = self.spend or SpendMeter(self.turn.conversation.owner)
        # The last stored answer is acted on again (its pending calls); earlier ones are done.
        self.first_step = max(self.turn.llm_iterations - 1, 0)

    def replayed(self, step: int) -> LLMResponse | None:
        return STORED if step < self.turn.llm_iterations else None

    # --- asking -------------------------------------------------------------------------

    def check(self) -> Next | None:
        """Renew the lease while the turn runs; else say why not."""
        if runner.handing_back():
            return steps.HAND_BACK
        if _lease_renewing(pk=self.turn_id, token=self.token, until=lease_until()):
            self.verified_at = time.monotonic()
            return None
        status = Turn.objects.filter(pk=self.turn_id, lease_token=self.token).values_list("status", flat=True).first()
        if status == TurnStatus.PAUSED:  # an agent's limit or question paused it: let go
            return Next(steps.Kind.PAUSE)
        return steps.STOP  # ended, stopped, or no longer ours

    def before_call(self) -> Next | None:
        """The lease and the turn's counters as stored, unless this delivery found the
        lease its own a moment ago (its claim, its last answer stored, the step's hold):
        then what it holds is current, since only the holder moves them."""
        if runner.handing_back():
            return steps.HAND_BACK
        if time.monotonic() - self.verified_at > VERIFIED_SECONDS:
            if (stop := self.check()) is not None:
                return stop
            self.turn.refresh_from_db(fields=["limits", "llm_iterations", "llm_retries"])
        self.limits = limits = Limits.from_json(self.turn.limits)
        if self.turn.llm_iterations >= limits.turn_max_llm_iterations:
            return steps.pause(LimitTripped(
                "turn_max_llm_iterations",
                f"The orchestrator used its {limits.turn_max_llm_iterations} LLM iterations "
                "for this turn without a final answer.",
                detail={"limit": limits.turn_max_llm_iterations, "used": self.turn.llm_iterations},
            ))
        profiles = self.profiles = self.profiles or profiles_by_name()  # read once a delivery
        prompt = orchestrator_system_prompt(
            catalogue=catalogue(self.turn.conversation.owner), profiles=[{"name": p.name, "description": p.description} for p in profiles.values()],
            local_time=user_local_time(self.turn),
        )
        tools = orchestrator_tools(profile_names=list(profiles), max_tool_calls_cap=limits.agent_max_tool_calls_cap)
        messages = llm_messages(turn=self.turn, system_prompt=prompt)
        model = settings.ASSISTANT_ORCHESTRATOR_MODEL
        # Reserved before the call is made; a call the allowance cannot cover pauses the turn.
        self.spend.reserve(model=model, messages=messages, tools=tools)
        self.call = {"model": model, "messages": messages, "tools": tools}
        return None

    def request(self) -> dict:
        return {**self.call, "provider": self.provider, "on_text": _DraftWriter(self.turn, self.token),
                "max_tokens": self.spend.max_tokens}

    def retries(self) -> tuple[int, int]:
        return self.turn.llm_retries, self.limits.orchestrator_max_retries

    @transaction.atomic
    def record_retry(self, retry: int, exc: LLMError, delay: float, step: int, took_ms: int) -> Next | None:
        if not Turn.objects.filter(pk=self.turn_id, lease_token=self.token).update(
                lease_expires_at=lease_until(), llm_retries=retry, answer_draft=""):
            return steps.STOP
        self.turn.llm_retries = retry
        event_record(
            type=ORCHESTRATOR_LLM_RETRY, turn=self.turn,
            summary=f"Orchestrator call {step + 1}: retry {retry} in {delay:.1f}s: {str(exc)[:120]}",
            payload={"iteration": step + 1, "retry": retry, "reason": str(exc), "backoff_seconds": delay,
                     "duration_ms": took_ms},
        )
        return None

    def priority(self) -> capacity.Priority:
        """The user's question goes before every sub-agent's call."""
        return capacity.Priority(orchestrator=True, user=self.turn.conversation.owner_id, depth=0)

    def record_wait(self, step: int, waited: float, model: str) -> None:
        event_record(type=LLM_WAITING, turn=self.turn,
                     summary=f"Orchestrator call {step + 1}: waited {waited:.1f}s for the provider's rate limit",
                     payload={"iteration": step + 1, "model": model, "waited_ms": int(waited * 1000)})

    def release_reservation(self) -> None:
        self.spend.release()

    def charge(self, response: LLMResponse) -> None:
        """The call counts at what it used, in its own commit: even if storing it fails."""
        self.spend.settle(response.usage, call_cost(response.model or self.call["model"], response.usage))

    def settle_up(self) -> None:
        if self.spend is not None:
            self.spend.flush()

    def ahead(self, step: int, response: LLMResponse) -> LLMResponse:
        return response  # nothing runs before the answer is stored

    def store(self, step: int, response: LLMResponse, duration_ms: int) -> Next | None:
        """Store the answer, its (uniquely named) tool calls and its event, or nothing.
        Stored while the lease is ours, whatever the turn's status: it is paid for."""
        try:
            return self._store(step, response, duration_ms)
        except IntegrityError:  # another delivery stored this step: replay it
            raise steps.StoredElsewhere(self.label) from None

    @transaction.atomic
    def _store(self, step: int, response: LLMResponse, duration_ms: int) -> Next | None:
        turn, iteration, model = self.turn, step + 1, response.model or self.call["model"]
        usage = _usage(response)
        if not _answer_counting(pk=self.turn_id, token=self.token, until=lease_until(), **usage):
            return steps.STOP
        # The ids this turn has used, as the request that was answered sent them.
        taken = {m.get("tool_call_id") for m in self.call["messages"] if m.get("tool_call_id")}
        taken.update(c["id"] for m in self.call["messages"] for c in m.get("tool_calls") or [])
        calls = unique_ids(response.tool_calls, taken, suffix=str(iteration), blank="call_")
        llm_call_record(LLMCall(turn=turn, key=f"orchestrator:{iteration}", model=model, response=response.to_json(),
                                duration_ms=duration_ms, **usage, cost_usd=call_cost(model, response.usage)))
        turn.llm_iterations = iteration
        tool_calls = [tool_call_message(call) for call in calls]
        assistant = message_append(  # the whole response is in the LLMCall above; the chat keeps a bounded copy
            turn=turn, role=Message.Role.ASSISTANT,
            content=text_bounded(response.content, limit=output_limit("answer_chars")), tool_calls=tool_calls,
        )
        if problem := _response_problem(response, calls):
            message_append(turn=turn, role=Message.Role.NOTE, content=problem)
        transaction.on_commit(lambda: setattr(self, "stored", (assistant, tool_calls, bool(problem))))
        event_record(
            type=ORCHESTRATOR_LLM_CALL, turn=turn, summary=_llm_summary(iteration, response, calls),
            payload={"iteration": iteration, "model": model, "duration_ms": duration_ms,
                     "finish_reason": response.finish_reason, "usage": usage,
                     "tool_calls": [{"name": c.name, "arguments": c.arguments[:2000]} for c in calls],
                     "content": response.content[:2000]},
        )
        return None

    # --- acting -------------------------------------------------------------------------

    def acts_on_skills(self, response: LLMResponse) -> bool:
        return False  # the orchestrator's tools are bookkeeping; agents run the skills

    def act(self, step: int, response: LLMResponse) -> Next:
        """Answer the last answer's pending tool calls; then it answered the user, waits
        for its agents, or asks again."""
        try:
            return self._act()
        except LeaseLost:  # an agent paused the turn meanwhile (let go), or it is not ours
            return self.check() or steps.STOP

    def _act(self) -> Next:
        """Act on the last answer: the one just stored, or (replaying) as the history has it."""
        turn, stored, self.stored = self.turn, self.stored, None
        if stored is not None:
            assistant, pending, noted = stored
        else:
            (assistant, pending), noted = pending_tool_calls(turn), None
        if pending:
            return self._answer_tool_calls(pending)
        if assistant is None or not assistant.content:
            return steps.AGAIN
        if noted is None:  # did an engine note follow it?
            noted = assistant.seq != _last_seq(turn)
        return steps.AGAIN if noted else steps.done("completed", answer=assistant)

    def _answer_tool_calls(self, pending: list[dict]) -> Next:
        calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                 for c in pending]
        if dispatch_calls := [call for call in calls if call.name == DISPATCH_AGENT]:
            self._dispatch_batch(dispatch_calls)
        for call in calls:
            if call.name == DISPATCH_AGENT:
                continue
            if call.name == GET_AGENT_RESULTS:
                if self._agent_results(call) is steps.WAIT:
                    return steps.WAIT
                continue
            if call.name == GET_SKILL:
                content = _get_skill(call, self.turn.conversation.owner)
            else:
                content = error_json(f"unknown tool {call.name!r}; the tools are {', '.join(ORCHESTRATOR_TOOL_NAMES)}.")
            with transaction.atomic():
                self._hold()
                message_append(turn=self.turn, role=Message.Role.TOOL, content=content, tool_call_id=call.id)
        return steps.AGAIN

    def _hold(self) -> None:
        """Renew the lease inside the caller's transaction, or stop writing (LeaseLost)."""
        if not _lease_renewing(pk=self.turn_id, token=self.token, until=lease_until()):
            raise LeaseLost(f"turn {self.turn_id}: lease lost")
        self.verified_at = time.monotonic()

    def _held(self, locked: Turn) -> None:
        """`_hold` for a turn the caller has just locked: its row says whether it is still
        ours (only the holder and those who lock it move the lease), and the answer this
        step stored renewed the lease a moment ago. One UPDATE fewer on the dispatch and
        results paths."""
        if locked.lease_token != self.token or locked.status != TurnStatus.RUNNING:
            raise LeaseLost(f"turn {self.turn_id}: lease lost")
        self.verified_at = time.monotonic()

    def _dispatch_batch(self, calls: list[ToolCall]) -> None:
        turn = self.turn
        task_prompt = next((content for content, in _task_prompt(turn.pk)), "")
        domains = skill_domains(calls, turn.conversation.owner)
        with transaction.atomic():
            locked = lifecycle.lock_turn(turn.pk)
            self._held(locked)
            planned = dispatch_batch(turn=locked, calls=calls, task_prompt=task_prompt, domains=domains,
                                     profiles=self.profiles)
            answers = [{"role": Message.Role.TOOL, "tool_call_id": item.call.id,
                        "content": error_json(item.error, agent_id=item.spec.get("agent_id")) if item.error
                        else dispatch_result_json(item.spec["agent_id"])} for item in planned]
            messages_append(turn=locked, messages=answers)
        # Its agents run now (inline, where there is no runner, before this returns) and may
        # pause the turn, and the owner may stop them: the next call asks first.
        self.verified_at = float("-inf")

    def _agent_results(self, call: ToolCall) -> Next:
        arguments, error = parse_arguments(call.arguments, get_agent_results_parameters())
        with transaction.atomic():
            turn = lifecycle.lock_turn(self.turn_id)
            self._held(turn)
            if error:
                message_append(turn=turn, role=Message.Role.TOOL, content=error_json(error), tool_call_id=call.id)
                return steps.AGAIN
            # Only the orchestrator's own agents: a nested agent reports to its parent.
            top_level = _top_level_agents.instances(AgentDispatch, turn.pk)
            for dispatch in top_level:
                dispatch.turn = turn  # as the related manager would: the merge reads it
            names = arguments.get("agent_ids") or [d.agent_id for d in top_level]
            found = {d.agent_id: d for d in top_level if d.agent_id in names}
            if any(not lifecycle.is_terminal(d) for d in found.values()):
                # Waits, holding nothing; the agent finishing last wakes it (dispatch_schedule).
                lifecycle.turn_move(turn.pk, source=TurnStatus.RUNNING, target=TurnStatus.WAITING,
                                    awaiting={"tool_call_id": call.id, "agent_ids": sorted(found)},
                                    lease_token="", lease_expires_at=None)
                return steps.WAIT
            results = lifecycle.dispatch_results_collect(names, found)
            message_append(turn=turn, role=Message.Role.TOOL, content=json.dumps(results), tool_call_id=call.id)
            # What the orchestrator has now read reaches every agent it dispatches from here on.
            outside = lifecycle.merged(turn.outside, *(d.outside for d in found.values()))
            Turn.objects.filter(pk=turn.pk).update(awaiting={}, outside=outside)
        return steps.AGAIN

    def too_many_steps(self) -> Next:
        return steps.done("failed", error="no answer within the engine's step limit")

    # --- ending -------------------------------------------------------------------------

    def end(self, next_step: Next) -> None:
        kind = next_step.kind
        if kind is steps.Kind.DONE and not next_step.error:
            turn_complete(turn_id=self.turn_id, token=self.token, answer=next_step.answer)
        elif kind is steps.Kind.DONE:
            error = next_step.error
            if error.startswith("LLM error: "):
                error = f"The model could not be reached: {error.removeprefix('LLM error: ')}"
            turn_fail(turn_id=self.turn_id, error=error, token=self.token)
        elif kind is steps.Kind.PAUSE and next_step.trip is not None:
            if turn_pause(turn_id=self.turn_id, trip=next_step.trip, token=self.token) is None:
                lifecycle.turn_give_back(self.turn_id, self.token)  # paused by someone else first
        elif kind in (steps.Kind.PAUSE, steps.Kind.HAND_BACK):
            lifecycle.turn_give_back(self.turn_id, self.token)


class _DraftWriter:
    """Receives the answer as it streams and stores it for the page, at most once every
    ASSISTANT_STREAM_INTERVAL_SECONDS: the page follows a few times a second, however
    fast the tokens come. What arrives after the last write is in the stored answer."""

    def __init__(self, turn: Turn, token: str):
        self.turn, self.token = turn, token
        self.written_at = float("-inf")

    async def __call__(self, text: str) -> None:
        now = asyncio.get_running_loop().time()
        if now - self.written_at >= settings.ASSISTANT_STREAM_INTERVAL_SECONDS:
            self.written_at = now
            try:
                await runner.db(turn_draft_save, turn=self.turn, token=self.token, text=text)
            except Exception as exc:  # a draft is cosmetic: never cut a paid call short for it
                if not is_transient(exc):
                    raise
                logger.info("turn %s: a draft was not saved (%s); the answer is stored whole", self.turn.pk, exc)


def _last_seq(turn: Turn) -> int:
    """The last message the model can see (notices to the user do not count)."""
    seen = turn.messages.exclude(role=Message.Role.NOTICE)
    return seen.order_by("-seq").values_list("seq", flat=True).first() or 0


def _get_skill(call: ToolCall, owner) -> str:
    arguments, error = parse_arguments(call.arguments, get_skill_parameters())
    if error:
        return error_json(error)
    return json.dumps(get_skill_tool_result(arguments.get("domain"), owner))


def _response_problem(response: LLMResponse, calls: list[ToolCall]) -> str:
    """A note back to the model when its reply cannot be used as it is."""
    if calls:
        return ""
    if response.finish_reason == "length":
        return "Your reply was cut off (finish_reason=length). Reply again, more briefly."
    if not response.content.strip():
        return "Your reply was empty. Call a tool or answer the user."
    return ""


def _usage(response: LLMResponse) -> dict:
    return {"prompt_tokens": response.usage.prompt_tokens, "completion_tokens": response.usage.completion_tokens,
            "cached_tokens": response.usage.cached_tokens}


def _llm_summary(iteration: int, response: LLMResponse, calls: list[ToolCall]) -> str:
    if calls:
        return f"Orchestrator call {iteration}: {', '.join(call.name for call in calls)}"
    return f"Orchestrator call {iteration}: answer ({response.finish_reason})"
