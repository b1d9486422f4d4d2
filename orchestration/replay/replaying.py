"""Run a stored turn again with its recorded answers and results; report divergences.

The recording (`recording_of`) is read from the turn's rows: the orchestrator's model
answers in order, each agent's in step order (by agent id), every skill call's stored
outcome (by agent id and tool-call id), and how the owner answered each question. The
replay (`replay`) runs a new turn with the same message and limits in a conversation of
its own, inline in this process, with a provider that answers from the recording and
skills whose handlers give back the recorded outcomes; it answers the questions the new
run asks as the owner did. Then it compares what the two runs did:

- the turn's status, and each agent's outcome and model calls;
- the tool calls each role made (names and arguments), in order, and the tool results
  fed back to its model (a changed limit decision or refusal shows here);
- the sequence of event types;
- a model answer or skill result the new run asked for that the recording does not hold.

The replay's conversation is deleted afterwards unless it is kept (`keep=True`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace

from orchestration.llm import LLMError, LLMResponse
from orchestration.models import (
    ACTIVE_TURN_STATUSES,
    AgentDispatch,
    Conversation,
    Event,
    Message,
    SkillApproval,
    Turn,
    TurnStatus,
)
from orchestration.records.catalogue import AGENT_ATTEMPT, LLM_WAITING, ORCHESTRATOR_LLM_RETRY
from orchestration.replay.inline import engine_with
from orchestration.replay.recording import (
    MODEL_FAILED,
    NO_ANSWER,
    Recording,
    answer_for,
    failure_for,
    recorded_results,
    recording_of,
)
from skills.base import SkillError

REPLAY_TITLE = "Replay of turn {turn}"
PROVIDER_WEATHER = (ORCHESTRATOR_LLM_RETRY, AGENT_ATTEMPT, LLM_WAITING)


@dataclass
class Replay:
    stored: Turn
    replayed: Turn | None = None
    divergences: list[str] = field(default_factory=list)
    model_calls: int = 0
    skill_calls: int = 0

    @property
    def diverged(self) -> bool:
        return bool(self.divergences)


class RecordedModel:
    """A provider answering each request with the recorded answer for its role and step."""

    def __init__(self, recording: Recording, replay: Replay):
        self.recording = recording
        self.replay = replay

    def complete(self, *, model: str, messages: list[dict], tools: list[dict], **_) -> LLMResponse:
        who, step, answer = answer_for(self.recording, messages, tools)
        self.replay.model_calls += 1
        if answer is not None:
            return LLMResponse.from_json(answer)
        if (error := failure_for(self.recording, who)) is not None:
            raise LLMError(error.removeprefix(f"{MODEL_FAILED}: "), transient=False)  # as the model refused it
        self.replay.divergences.append(f"{who} asked for model answer {step + 1}; the stored turn has fewer")
        return LLMResponse(content=NO_ANSWER, model=model)

    async def acomplete(self, **kwargs) -> LLMResponse:
        kwargs.pop("on_text", None)
        return self.complete(**kwargs)


def _recorded_skill(results: dict, replay: Replay, real_get_skill):
    """`get_skill` whose skills' handlers give back the recorded outcome of the call, after
    making again the nested calls it made (each answered from the recording in turn), so
    that they count, ask and are refused as they were."""
    from skills.context import running_call
    from skills.executor import execute_skill
    from skills.timeouts import SkillTimeout

    def get_skill(name, user=None):
        skill = real_get_skill(name, user)

        def handler(_user, /, **arguments) -> dict:
            row = running_call.get().row
            key = (row.dispatch.agent_id, row.tool_call_id)
            stored = results.get(key)
            replay.skill_calls += 1
            if stored is None:
                replay.divergences.append(f"agent {key[0]} called {name} as {key[1]}, which the stored turn did not")
                raise SkillError("replay: the stored turn holds no result for this call")
            if stored.skill != name or stored.arguments != arguments:
                replay.divergences.append(f"agent {key[0]}'s call {key[1]}: {name} {_short(arguments)} now, "
                                          f"{stored.skill} {_short(stored.arguments)} stored")
            for child in sorted((r for r in results.values() if r.parent_id == stored.pk), key=lambda r: r.pk):
                execute_skill(name=child.skill, arguments=child.arguments, user=_user, tool_call_id=child.tool_call_id)
            if stored.status == "completed":
                return stored.result
            if stored.status == "timeout":
                raise SkillTimeout(skill.effective_timeout)
            raise SkillError(stored.error or "failed", permanent=not (stored.result or {}).get("retryable"))

        return replace(skill, handler=handler, external=False)  # nothing is sent: no call is in doubt

    return get_skill


def replay(turn: Turn, *, keep: bool = False) -> Replay:
    """Run `turn` again from its records; the divergences from the stored run."""
    from orchestration.lifecycle.turns import turn_start, turn_stop
    from orchestration.questions.approvals import approval_answer
    from orchestration.questions.pauses import turn_continue
    from orchestration.reports.retention import conversation_delete

    recording = recording_of(turn)
    result = Replay(stored=turn)
    owner = turn.conversation.owner
    conversation = Conversation.objects.create(owner=owner, title=REPLAY_TITLE.format(turn=turn.pk))
    pauses = list(recording.pauses)
    try:
        from skills import registry

        skills = _recorded_skill(recorded_results(recording.turn_id), result, registry.get_skill)
        with engine_with(RecordedModel(recording, result), skills, recording.limits, ASSISTANT_OTEL_TRACES=False):
            new = turn_start(conversation=conversation, text=recording.text)
            new.refresh_from_db()
            for _ in range(50):  # each question the stored turn answered, answered the same way
                if new.status != TurnStatus.PAUSED:
                    break
                asked = SkillApproval.objects.filter(turn=new, decision="").select_related("dispatch").first()
                if asked is not None:
                    decision = recording.decision(asked.dispatch.agent_id, asked.skill)
                    if decision is None:
                        result.divergences.append(f"the new run asked to approve {asked.skill} for "
                                                  f"{asked.dispatch.agent_id}; the stored turn did not")
                    approval_answer(turn=new, user=owner, approval_id=asked.pk, digest=asked.digest,
                                    approve=decision != "denied")
                elif pauses and pauses.pop(0) == "continue":
                    turn_continue(turn=new, user=owner)
                else:
                    result.divergences.append("the new run paused where the stored turn did not go on")
                    break
                new.refresh_from_db()
        result.divergences += compare(turn, new)
        result.replayed = new if keep else None  # its rows are gone with its conversation
    finally:
        for active in Turn.objects.filter(conversation=conversation, status__in=ACTIVE_TURN_STATUSES):
            result.divergences.append(f"the new run did not end ({active.status}); it was stopped")
            turn_stop(turn=active, user=owner)
        if not keep:
            conversation_delete(conversation=conversation, user=owner)
    return result


def compare(stored: Turn, new: Turn, *, results: bool = True) -> list[str]:
    """What the new run did differently, one sentence each. `results=False` leaves the
    tool results out (a run whose skills ran live, on other records: ids and times differ)."""
    found = []
    if new.status != stored.status:
        found.append(f"the turn ended {new.status}; stored: {stored.status}")
    old_agents, new_agents = _agents(stored), _agents(new)
    for agent in sorted(set(old_agents) | set(new_agents)):
        before, after = old_agents.get(agent), new_agents.get(agent)
        if before is None or after is None:
            found.append(f"agent {agent} {'was not dispatched' if after is None else 'was dispatched'} in the new "
                         f"run{'' if after is None else ', not in the stored turn'}")
            continue
        if before.outcome != after.outcome:
            found.append(f"agent {agent} ended {after.outcome or after.state}; "
                         f"stored: {before.outcome or before.state}")
        found += _transcripts(f"agent {agent}", before.transcript, after.transcript, results)
    found += _transcripts("the orchestrator", _history(stored), _history(new), results)
    old_events, new_events = _event_types(stored), _event_types(new)
    if old_events != new_events:
        found.append(f"event types differ: {_counts(old_events, new_events)}")
    return found


def _agents(turn: Turn) -> dict[str, AgentDispatch]:
    return {d.agent_id: d for d in AgentDispatch.objects.filter(turn=turn)}


def _history(turn: Turn) -> list[dict]:
    return [{"role": m.role, "content": m.content, "tool_calls": m.tool_calls}
            for m in Message.objects.filter(turn=turn).exclude(role=Message.Role.NOTICE).order_by("seq")]


def _transcripts(who: str, before: list[dict], after: list[dict], results: bool) -> list[str]:
    """Tool calls and tool results, in order: where they first differ."""
    old, new = _tool_trace(before, results), _tool_trace(after, results)
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return [f"{who}, tool exchange {i + 1}: now {_short(b)}; stored {_short(a)}"]
    if len(old) != len(new):
        return [f"{who} had {len(new)} tool exchanges; stored: {len(old)}"]
    return []


def _tool_trace(messages: list[dict], results: bool = True) -> list:
    trace = []
    for message in messages or []:
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            trace.append(("call", function.get("name"), function.get("arguments")))
        if message.get("role") == "tool":
            trace.append(("result", _normalised(message.get("content")) if results else "…"))
    return trace


def _normalised(content) -> object:
    """A tool result without what differs between any two runs (ids, times, durations)."""
    try:
        value = json.loads(content) if isinstance(content, str) else content
    except ValueError:
        return content
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ("duration_ms", "execution_id")}
        if isinstance(value.get("agents"), list):
            value["agents"] = [{k: v for k, v in a.items() if k != "duration_ms"} for a in value["agents"]]
    return value


def _event_types(turn: Turn) -> list[str]:
    """The turn's event types, less the provider's own weather: retries of a failed model
    call, failed attempts and waits for its rate limit (the recording holds the answers
    that came, not the failures before them)."""
    return list(Event.objects.filter(turn=turn).exclude(type__in=PROVIDER_WEATHER).order_by("id")
                .values_list("type", flat=True))


def _counts(before: list[str], after: list[str]) -> str:
    old, new = Counter(before), Counter(after)
    changed = sorted(set(old) | set(new))
    return ", ".join(f"{t} {old[t]}→{new[t]}" for t in changed if old[t] != new[t]) or "same counts, other order"


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 160 else text[:159] + "…"
