"""What a stored turn holds for a replay, as plain data: its recording.

The user's message and the limits the turn started with; the orchestrator's model
answers in order and each agent's in step order (by agent id, its mission naming it in
a request); how the owner answered each question. `answer_for` picks the answer a
request is asking for, the same way for the engine's replay (replaying.py) and for the
scripted model server a test runs from an exported recording (`to_json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestration.models import AgentDispatch, LLMCall, Message, SkillApproval, SkillExecution, Turn, TurnPause
from orchestration.records.history import ENGINE_NOTE_PREFIX

NO_ANSWER = "(replay: the stored turn holds no answer here)"
MODEL_FAILED = "LLM error"  # how a failed model call is stored (orchestration/engine/loop.py)
FORMAT = 1


@dataclass
class Recording:
    turn_id: int
    text: str
    limits: dict  # as the turn started (a Continue raised the limit it tripped)
    orchestrator: list[dict]  # LLMResponse JSON, in order
    agents: dict[str, list[dict]]  # agent_id → LLMResponse JSON, by step
    missions: dict[str, str]  # mission → agent_id
    approvals: list[list[str]] = field(default_factory=list)  # [agent_id, skill, decision], in order
    pauses: list[str] = field(default_factory=list)  # each continue? pause's decision, in order
    # The model's refusals: who ("orchestrator" or an agent id) got an error instead of an
    # answer after the ones recorded (a stored failure has no answer to store).
    failures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> Recording:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a turn recording of format {FORMAT}")
        return cls(**{k: v for k, v in data.items() if k != "format"})

    def decision(self, agent_id: str, skill: str) -> str | None:
        return next((d for a, s, d in self.approvals if (a, s) == (agent_id, skill)), None)


def recording_of(turn: Turn) -> Recording:
    dispatches = {d.pk: d for d in AgentDispatch.objects.filter(turn=turn)}
    calls = list(LLMCall.objects.filter(turn=turn).order_by("id"))
    agents: dict[str, list[dict]] = {}
    for call in calls:
        if call.dispatch_id is not None:
            step = int(call.key.rsplit(":s", 1)[1])
            answers = agents.setdefault(dispatches[call.dispatch_id].agent_id, [])
            answers.extend([{}] * (step + 1 - len(answers)))
            answers[step] = call.response
    orchestrator = [call.response for call in sorted(
        (c for c in calls if c.dispatch_id is None), key=lambda c: int(c.key.rsplit(":", 1)[1]))]
    message = Message.objects.filter(turn=turn, role=Message.Role.USER).order_by("seq").first()
    limits = dict(turn.limits)
    for pause in TurnPause.objects.filter(turn=turn).order_by("-id"):  # the earliest trip's figure wins
        if pause.limit in limits and "limit" in (pause.detail or {}):
            limits[pause.limit] = pause.detail["limit"]
    return Recording(
        turn_id=turn.pk, text=message.content if message else "", limits=limits, orchestrator=orchestrator,
        agents=agents, missions={d.mission: d.agent_id for d in dispatches.values()},
        approvals=[[a.dispatch.agent_id, a.skill, a.decision]
                   for a in SkillApproval.objects.filter(turn=turn).select_related("dispatch").order_by("id")],
        pauses=list(TurnPause.objects.filter(turn=turn).exclude(limit="approval").order_by("id")
                    .values_list("decision", flat=True)),
        failures={**{d.agent_id: d.error for d in dispatches.values() if d.error.startswith(MODEL_FAILED)},
                  **({"orchestrator": turn.error} if turn.error.startswith(MODEL_FAILED) else {})},
    )


def recorded_results(turn_id: int) -> dict[tuple[str, str], SkillExecution]:
    """Every stored skill call of the turn by (agent id, tool-call id)."""
    return {(e.dispatch.agent_id, e.tool_call_id): e
            for e in SkillExecution.objects.filter(dispatch__turn_id=turn_id).select_related("dispatch").order_by("id")}


def answer_for(recording: Recording, messages: list[dict], tools: list[dict]) -> tuple[str, int, dict | None]:
    """(who asks, which answer, the recorded answer or None) for a Chat Completions request:
    an agent's request offers `use_skill` and names its mission; its step is the number of
    answers it has had. The orchestrator's counts from this turn's message. (`failure_for`
    says whether the model refused the request the recording has no answer for.)"""
    names = {tool["function"]["name"] for tool in tools or []}
    if "use_skill" in names:
        task = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        agent = next((a for mission, a in recording.missions.items() if task.startswith(f"Mission:\n{mission}")), "?")
        who, answers = f"agent {agent}", recording.agents.get(agent, [])
        step = sum(1 for m in messages if m.get("role") == "assistant")
    else:
        who, answers = "the orchestrator", recording.orchestrator
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"
                         and not str(m.get("content") or "").startswith(ENGINE_NOTE_PREFIX)), default=0)
        step = sum(1 for m in messages[last_user:] if m.get("role") == "assistant")
    answer = answers[step] if step < len(answers) and answers[step] else None
    return who, step, answer


def failure_for(recording: Recording, who: str) -> str | None:
    """The stored error of `who` ("the orchestrator", "agent X") when its model failed."""
    return recording.failures.get("orchestrator" if who == "the orchestrator" else who.removeprefix("agent "))
