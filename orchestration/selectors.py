"""Read-side queries used by the web layer and the commands."""

from __future__ import annotations

from django.db.models import QuerySet

from orchestration.events import AGENT_LLM_CALL, SKILL_FINISHED
from orchestration.models import AgentDispatch, Conversation, Event, Message


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


def agent_graph(*, turn) -> list[dict]:
    """The turn's dispatches as a tree: each node with its state and its children."""
    dispatches = list(turn.dispatches.only(  # not the transcripts and contracts: pushed often
        "turn_id", "parent_id", "agent_id", "state", "outcome", "tool_calls_used", "max_tool_calls", "depends_on"))

    progress = agent_progress(turn=turn)

    def children(parent_id):
        return [
            {"dispatch": d, "state": display_state(d), "progress": progress.get(d.pk), "children": children(d.pk)}
            for d in dispatches
            if d.parent_id == parent_id
        ]

    return children(None)


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


def conversation_usage(*, conversation: Conversation) -> dict:
    from django.conf import settings
    from django.db.models import Sum

    fields = {"prompt": Sum("prompt_tokens"), "completion": Sum("completion_tokens"), "cached": Sum("cached_tokens")}
    totals = conversation.turns.aggregate(**fields)
    # An agent's usage reaches its turn when it ends (in the same transaction that sets
    # finished_at); until then its row holds it, as of its last step.
    running = AgentDispatch.objects.filter(turn__conversation=conversation, finished_at__isnull=True).aggregate(**fields)
    totals = {key: (totals[key] or 0) + (running[key] or 0) for key in fields}
    prompt, completion = totals["prompt"], totals["completion"]
    cost = (
        prompt * settings.ASSISTANT_PRICE_PROMPT_PER_MTOK
        + completion * settings.ASSISTANT_PRICE_COMPLETION_PER_MTOK
    ) / 1_000_000
    return {"prompt": prompt, "completion": completion, "cached": totals["cached"],
            "total": prompt + completion, "cost": cost}


def timeline(*, conversation: Conversation):
    """Every event of the conversation, oldest first, for the first render of the page."""
    return conversation.events.for_timeline().order_by("id")


def timeline_groups(*, conversation: Conversation) -> tuple[list[dict], int]:
    """The timeline grouped by turn, then by sub-agent; and the last event id shown."""
    turns: dict = {}
    dispatch_groups: dict = {}
    last_id = 0
    for event in timeline(conversation=conversation):
        last_id = event.pk
        group = turns.setdefault(event.turn_id, {"turn": event.turn, "items": []})
        if event.dispatch_id is None:
            group["items"].append({"event": event})
            continue
        if event.dispatch_id not in dispatch_groups:
            dispatch_groups[event.dispatch_id] = {"dispatch": event.dispatch, "events": []}
            group["items"].append(dispatch_groups[event.dispatch_id])
        dispatch_groups[event.dispatch_id]["events"].append(event)
    return list(turns.values()), last_id
