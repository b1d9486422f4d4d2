"""Every limit of DESIGN.md §5 in one place: what it is, its default, how it trips.

A turn keeps a snapshot of these (Turn.limits) so a settings change never alters a turn
in flight, and Continue raises the snapshot's budget for the tripped kind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from django.conf import settings


@dataclass(frozen=True, kw_only=True)
class Limits:
    skill_timeout_seconds: float
    """Per skill call: the skill executor's deadline."""
    agent_max_tool_calls: int
    """Per sub-agent: default tool-call budget when the dispatch names none."""
    agent_max_tool_calls_cap: int
    """Per sub-agent: the most a dispatch may ask for."""
    agent_token_budget: int
    """Per sub-agent: prompt + completion tokens across its LLM calls."""
    agent_timeout_seconds: float
    """Per sub-agent: wall clock from its first start."""
    agent_max_retries: int
    """Per sub-agent: retries of a model call that still failed for a transient reason
    after the SDK's own retries; the call is asked again with the transcript as it stood."""
    orchestrator_max_retries: int
    """Per turn: the same, for the orchestrator's model calls."""
    turn_max_agents: int
    """Per turn: dispatches, nested ones included."""
    turn_max_skill_calls: int
    """Per turn: skill calls across all its agents."""
    turn_max_llm_iterations: int
    """Per turn: orchestrator LLM calls."""
    conversation_max_skill_calls: int
    """Per conversation: skill calls in any sliding window."""
    conversation_window_seconds: int
    """Per conversation: the sliding window's length."""
    max_delegation_depth: int
    """Nesting: how deep sub-agents may dispatch their own sub-agents."""
    turn_max_llm_calls: int
    """Per turn: the sub-agents' model calls (nested agents' too), so a model that never
    reports cannot spend without end; the orchestrator's are turn_max_llm_iterations."""
    turn_max_continues: int
    """Per turn: how many times Continue may grant a fresh budget; past it, only Stop."""

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(**settings.ASSISTANT_LIMITS)

    @classmethod
    def from_json(cls, data: dict) -> Limits:
        """The turn's snapshot, with settings filling any field it predates."""
        known = {f.name for f in fields(cls)}
        return replace(cls.from_settings(), **{k: v for k, v in data.items() if k in known})

    def to_json(self) -> dict:
        return asdict(self)

    def agent_tool_budget(self, requested: int | None) -> int:
        if not requested:
            return self.agent_max_tool_calls
        return max(1, min(int(requested), self.agent_max_tool_calls_cap))


@dataclass(frozen=True, kw_only=True)
class LimitWords:
    """A limit a turn can pause on, in the words the owner reads in the continue? prompt.

    `reached` and `label` are format strings: {limit}, {used} and {requested} are counts
    of the thing counted ("8 agents"), {window} the conversation's window ("5 minutes")."""

    one: str
    """The thing counted, singular."""
    many: str
    """The thing counted, plural."""
    label: str
    """The limit itself, short: "agents per turn"."""
    reached: str
    """Why the turn stopped, one sentence."""


LIMIT_WORDS = {
    "turn_max_agents": LimitWords(
        one="agent", many="agents", label="agents per turn",
        reached="This turn may start {limit} in all: it has started {used} and asked for another {requested}.",
    ),
    "turn_max_skill_calls": LimitWords(
        # "skill calls", as the agent graph counts them (an agent's tool calls are skill calls)
        one="skill call", many="skill calls", label="skill calls per turn",
        reached="This turn has made {used}, the most one turn may make.",
    ),
    "turn_max_llm_iterations": LimitWords(
        # the orchestrator's LLM calls: each plans, dispatches or answers
        one="planning step", many="planning steps", label="planning steps per turn",
        reached="The assistant has taken {used} on this turn without reaching an answer, the most one turn may take.",
    ),
    "turn_max_llm_calls": LimitWords(
        one="model call", many="model calls", label="agents' model calls per turn",
        reached="The agents have made {used} on this turn, the most one turn may make.",
    ),
    "conversation_max_skill_calls": LimitWords(
        one="skill call", many="skill calls", label="skill calls per {window} in a conversation",
        reached="This conversation has made {used} in the last {window}, the most it may make in that time.",
    ),
}


class LimitTripped(Exception):
    """A turn- or conversation-level limit is spent: the turn must pause and ask."""

    def __init__(self, limit: str, message: str, *, detail: dict | None = None):
        super().__init__(message)
        self.limit = limit
        self.message = message
        self.detail = detail or {}

    def summary(self, label: str) -> str:
        """The timeline's line for the trip; `label` names the limit in words."""
        return f"Limit reached: {label}"

    def record(self, pause) -> None:
        """Store what this question needs beside its TurnPause, in the pausing transaction
        (an approval's call: orchestration/questions/approvals.py)."""
