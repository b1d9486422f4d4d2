"""Read-side queries used by the web layer and the commands."""

from __future__ import annotations

from django.db.models import QuerySet

from orchestration.events import AGENT_LLM_CALL, SKILL_FINISHED
from orchestration.models import Conversation, Event, Message
from orchestration.usage import Spend, TurnSpend, conversation_spend, turn_spend


def conversations_for(*, user) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user).order_by("-updated_at", "-id")


def visible_messages(*, conversation: Conversation) -> QuerySet[Message]:
    """What the chat shows: the user's words and the assistant's answers.

    Tool calls and tool results are part of the orchestrator's history but belong in the
    timeline and audit views, not in the chat.
    """
    return conversation.messages.filter(
        role__in=[Message.Role.USER, Message.Role.ASSISTANT, Message.Role.NOTICE], tool_calls=[]
    ).exclude(content="")


def active_turn(*, conversation: Conversation):
    from orchestration.models import ACTIVE_TURN_STATUSES

    return conversation.turns.filter(status__in=ACTIVE_TURN_STATUSES).first()


def open_pause(*, conversation: Conversation):
    from orchestration.models import TurnPause

    return (
        TurnPause.objects.filter(turn__conversation=conversation, decision="")
        .select_related("turn")
        .first()
    )


def answered_pauses(*, conversation: Conversation):
    from orchestration.models import TurnPause

    return (
        TurnPause.objects.filter(turn__conversation=conversation)
        .exclude(decision="")
        .select_related("decided_by", "turn")
        .order_by("-decided_at")[:5]
    )


def agent_graph(*, turn) -> tuple[list[dict], TurnSpend]:
    """The turn's dispatches as a tree: each node with its state, its children and its
    spend with theirs (what delegating it cost); and the turn's spend."""
    dispatches = list(turn.dispatches.only(  # not the transcripts and contracts: pushed often
        "turn_id", "parent_id", "agent_id", "state", "outcome", "tool_calls_used", "max_tool_calls", "depends_on"))
    spend = turn_spend(turn, dispatches)

    progress = agent_progress(turn=turn)

    def children(parent_id):
        return [
            {"dispatch": d, "state": display_state(d), "spend": spend.agent_total(d.pk), "progress": progress.get(d.pk),
             "children": children(d.pk)}
            for d in dispatches
            if d.parent_id == parent_id
        ]

    return children(None), spend


def agent_progress(*, turn) -> dict[int, dict]:
    """Each agent's progress, from the turn's events: the model calls it has made (its
    steps) and its latest skill call, with that call's status ("running" until it ends).
    A light read (two payload keys, not the payloads): the graph re-renders it often."""
    from orchestration.budget import SKILL_STARTED

    progress: dict[int, dict] = {}
    rows = (Event.objects.filter(turn=turn, dispatch__isnull=False, type__in=(AGENT_LLM_CALL, SKILL_STARTED, SKILL_FINISHED))
            .order_by("id").values_list("dispatch_id", "type", "payload__skill", "payload__status"))
    for dispatch_id, type_, skill, status in rows:
        agent = progress.setdefault(dispatch_id, {"steps": 0, "skill": "", "skill_status": ""})
        if type_ == AGENT_LLM_CALL:
            agent["steps"] += 1
        else:
            agent.update(skill=skill or "", skill_status="running" if type_ == SKILL_STARTED else status or "")
    return progress


def display_state(dispatch) -> str:
    """closed is bookkeeping; people want to see how it ended."""
    if dispatch.state == "closed":
        return {"budget_exceeded": "completed", "": "closed"}.get(dispatch.outcome, dispatch.outcome)
    if dispatch.state == "waiting_for_merge":
        return "waiting"
    return dispatch.state


def conversation_usage(*, conversation: Conversation) -> Spend:
    """The counters panel's tokens and cost: every model call of the conversation so far,
    an agent's as soon as it is made (not only when the agent ends)."""
    return conversation_spend(conversation)


def timeline(*, conversation: Conversation):
    """Every event of the conversation, oldest first, for the first render of the page."""
    return conversation.events.for_timeline().order_by("id")
