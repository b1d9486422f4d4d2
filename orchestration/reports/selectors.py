"""Read-side queries used by the web layer and the commands."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.utils import timezone
from django.utils.timesince import timesince

from orchestration.budgets.usage import Spend, TurnSpend, conversation_spend, turn_and_conversation_spend, turn_spend
from orchestration.models import AgentDispatch, Conversation, DispatchOutcome, Event, Message, Turn
from orchestration.records.catalogue import AGENT_LLM_CALL, SKILL_FINISHED, SKILL_STARTED
from orchestration.records.compiled import CompiledRead


def conversations_for(*, user) -> QuerySet[Conversation]:
    """The user's conversations, most recent first, each with its latest turn's status,
    whether an agent of that turn failed (`latest_had_failures`: an answer is not the whole
    story then) and its latest event's time (`latest_status`, `latest_event_at`)."""
    latest_turn = Turn.objects.filter(conversation=OuterRef("pk")).order_by("-number")
    latest_event = Event.objects.filter(conversation=OuterRef("pk")).order_by("-id")
    failed_agent = AgentDispatch.objects.filter(
        turn_id=OuterRef("latest_turn_id"), outcome__in=(DispatchOutcome.FAILED, DispatchOutcome.TIMEOUT))
    return Conversation.objects.filter(owner=user).annotate(
        latest_turn_id=Subquery(latest_turn.values("pk")[:1]),
        latest_status=Subquery(latest_turn.values("status")[:1]),
        latest_event_at=Subquery(latest_event.values("created_at")[:1]),
    ).annotate(latest_had_failures=Exists(failed_agent)).order_by("-updated_at", "-id")


# Every state a page shows, in words: a turn's status, an agent's displayed state (see
# display_state) and a skill call's status share one vocabulary. Unknown states show as they are.
STATE_WORDS = {
    "created": "queued", "running": "running", "waiting": "waiting for its agents",
    "paused": "paused: waiting for you", "completed": "completed", "failed": "failed",
    "stopped": "stopped", "reported": "reported, not read yet", "skipped": "skipped", "cancelled": "cancelled", "closed": "closed",
    "timeout": "timed out", "budget_exceeded": "completed (its budget ran out)",
    "awaiting_approval": "waiting for your approval",
}


def state_words(state: str) -> str:
    return STATE_WORDS.get(state, str(state).replace("_", " "))


# A conversation's state in the list, from its latest turn's status.
CONVERSATION_STATES = {
    "running": "running", "waiting": "running", "paused": "waiting for you",
    "completed": "answered", "partial": "answered, an agent failed", "failed": "failed", "stopped": "stopped",
}


@dataclass(frozen=True)
class ConversationRow:
    conversation: Conversation
    state: str  # the latest turn's status, "" before the first request
    state_words: str
    last_activity: datetime
    last_activity_words: str


def conversation_rows(*, user) -> list[ConversationRow]:
    """The conversation list: each conversation with its state and last activity in words."""
    now = timezone.now()
    rows = []
    for conversation in conversations_for(user=user):
        at = max(filter(None, [conversation.updated_at, conversation.latest_event_at]))
        state = conversation.latest_status or ""
        if state == "completed" and conversation.latest_had_failures:
            state = "partial"
        rows.append(ConversationRow(
            conversation=conversation, state=state,
            state_words=CONVERSATION_STATES.get(state, "no messages yet"),
            last_activity=at, last_activity_words=activity_words(at, now=now),
        ))
    return rows


def activity_words(at: datetime, *, now: datetime) -> str:
    """ "just now" under a minute, then "5 minutes ago", "2 hours ago", "3 days ago"."""
    if (now - at).total_seconds() < 60:
        return "just now"
    return f"{timesince(at, now, depth=1)} ago"


# The chat re-renders with each turn's start and end: compiled once.
_visible_messages = CompiledRead(lambda conversation_id: Message.objects.filter(
    conversation_id=conversation_id, role__in=[Message.Role.USER, Message.Role.ASSISTANT, Message.Role.NOTICE],
    tool_calls=[],
).exclude(content="").order_by("seq").values_list("id", "seq", "role", "content"))


def visible_messages(*, conversation: Conversation) -> list[Message]:
    """What the chat shows: the user's words and the assistant's answers, in order.

    Tool calls and tool results are part of the orchestrator's history but belong in the
    timeline and audit views, not in the chat.
    """
    return _visible_messages.instances(Message, conversation.pk)


def active_turn(*, conversation: Conversation):
    from orchestration.models import ACTIVE_TURN_STATUSES

    return conversation.turns.filter(status__in=ACTIVE_TURN_STATUSES).first()


def open_pause(*, turn: Turn | None):
    """The question `turn` waits on, if any. A pause opens and closes with its turn's
    move to and from paused, so only a paused turn is read (and of a conversation, only
    its latest turn can be)."""
    from orchestration.models import TurnPause, TurnStatus

    if turn is None or turn.status != TurnStatus.PAUSED:
        return None
    return TurnPause.objects.filter(turn=turn, decision="").select_related("turn").first()


# What the agent graph and the waterfall show of a turn's agents: not their transcripts
# and contracts (the live page renders them often).
AGENT_FIELDS = ("turn_id", "parent_id", "agent_id", "depth", "state", "outcome", "depends_on", "error",
                "close_reason", "tool_calls_used", "max_tool_calls", "started_at", "finished_at", "duration_ms",
                "created_at")


@dataclass(frozen=True)
class TurnAgents:
    """A turn's agents, in dispatch order, and its spend: read once for all the panels of
    a push that show them (the graph and the waterfall). `conversation`: the whole
    conversation's spend, when the push shows the counters too."""

    dispatches: list[AgentDispatch]
    spend: TurnSpend
    conversation: Spend | None = None


# Read with every render of a running turn's graph and waterfall: compiled once.
_turn_agents = CompiledRead(lambda turn_id: AgentDispatch.objects.filter(turn_id=turn_id).order_by("id")
                            .values_list("id", *AGENT_FIELDS))


def turn_agents(turn, *, conversation_usage: bool = False) -> TurnAgents:
    """Two queries: the agents, then the turn's spend grouped by agent (and, with
    `conversation_usage`, the conversation's in the same query)."""
    dispatches = _turn_agents.instances(AgentDispatch, turn.pk)
    if conversation_usage:
        spend, conversation = turn_and_conversation_spend(turn, dispatches)
        return TurnAgents(dispatches=dispatches, spend=spend, conversation=conversation)
    return TurnAgents(dispatches=dispatches, spend=turn_spend(turn, dispatches))


def agent_graph(
    *, turn, agents: TurnAgents | None = None, events: list[Event] | None = None
) -> tuple[list[dict], TurnSpend]:
    """The turn's dispatches as a tree: each node with its state, its children and its
    spend with theirs (what delegating it cost); and the turn's spend. `agents`: as
    `turn_agents` read them, `events`: as `turn_events` did, if the caller has."""
    agents = agents or turn_agents(turn)
    dispatches, spend = agents.dispatches, agents.spend

    progress = agent_progress(turn=turn, events=events)
    asking = awaiting_approval(turn)

    def children(parent_id):
        return [
            {"dispatch": d, "state": "awaiting_approval" if d.pk in asking else display_state(d), "spend": spend.agent_total(d.pk), "progress": progress.get(d.pk),
             # a running agent's count is written when it stops; its events have it meanwhile
             "skill_calls": max(d.tool_calls_used, (progress.get(d.pk) or {}).get("skill_calls", 0)),
             "children": children(d.pk)}
            for d in dispatches
            if d.parent_id == parent_id
        ]

    return children(None), spend


def awaiting_approval(turn) -> set[int]:
    """The agents whose call waits for the owner's Approve or Deny: given back to the
    queue meanwhile, they are not "queued" to the person who holds them. Read only while
    the turn is paused (the graph renders often while it runs)."""
    from orchestration.models import SkillApproval, TurnStatus

    if turn.status != TurnStatus.PAUSED:
        return set()
    return set(SkillApproval.objects.filter(dispatch__turn=turn, decision="").values_list("dispatch_id", flat=True))


_turn_events = CompiledRead(lambda turn_id: Event.objects.filter(turn_id=turn_id).order_by("id")
                            .values_list("id", "type", "dispatch_id", "payload", "created_at"))


def turn_events(turn) -> list[Event]:
    """The turn's events for the waterfall (and the graph's progress, when both render)."""
    return _turn_events.instances(Event, turn.pk)


PROGRESS_EVENTS = (AGENT_LLM_CALL, SKILL_STARTED, SKILL_FINISHED)
_progress_rows = CompiledRead(lambda turn_id: Event.objects.filter(
    turn_id=turn_id, dispatch__isnull=False, type__in=PROGRESS_EVENTS,
).order_by("id").values_list("dispatch_id", "type", "payload__skill", "payload__status"))


def agent_progress(*, turn, events: list[Event] | None = None) -> dict[int, dict]:
    """Each agent's progress, from the turn's events: the model calls it has made (its
    steps) and its latest skill call, with that call's status ("running" until it ends).
    A light read (two payload keys, not the payloads): the graph re-renders it often. No
    read with `events`, the turn's (`turn_events`)."""
    progress: dict[int, dict] = {}
    if events is None:
        rows = _progress_rows(turn.pk)
    else:
        rows = [(e.dispatch_id, e.type, (e.payload or {}).get("skill"), (e.payload or {}).get("status"))
                for e in events if e.dispatch_id is not None and e.type in PROGRESS_EVENTS]
    for dispatch_id, type_, skill, status in rows:
        agent = progress.setdefault(dispatch_id, {"steps": 0, "skill_calls": 0, "skill": "", "skill_status": ""})
        if type_ == AGENT_LLM_CALL:
            agent["steps"] += 1
        else:
            agent["skill_calls"] += type_ == SKILL_STARTED
            agent.update(skill=skill or "", skill_status="running" if type_ == SKILL_STARTED else status or "")
    return progress


def display_state(dispatch) -> str:
    """closed is bookkeeping; people want to see how it ended."""
    if dispatch.state == "closed":
        return {"budget_exceeded": "completed", "": "closed"}.get(dispatch.outcome, dispatch.outcome)
    if dispatch.state == "waiting_for_merge":
        return "reported"
    return dispatch.state


def conversation_usage(*, conversation: Conversation) -> Spend:
    """The counters panel's tokens and cost: every model call of the conversation so far,
    an agent's as soon as it is made (not only when the agent ends)."""
    return conversation_spend(conversation)


def timeline(*, conversation: Conversation):
    """Every event of the conversation, oldest first, for the first render of the page."""
    return conversation.events.for_timeline().order_by("id")
