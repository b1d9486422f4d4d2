"""Plain builders for engine rows: the one place tests make conversations, turns,
dispatches and spend so far."""

from __future__ import annotations

from django.utils import timezone

from orchestration.budgets.spending import spend_periods_start
from orchestration.models import AgentDispatch, Conversation, SpendCounter, Turn


def conversation_for(user, *, title: str = "Test conversation") -> Conversation:
    return Conversation.objects.create(owner=user, title=title)


def turn_for(conversation: Conversation, **fields) -> Turn:
    number = conversation.turns.count() + 1
    return Turn.objects.create(conversation=conversation, number=number, **fields)


def dispatch_for(turn: Turn, agent_id: str = "a1", **fields) -> AgentDispatch:
    fields.setdefault("mission", f"Mission of {agent_id}")
    return AgentDispatch.objects.create(turn=turn, agent_id=agent_id, **fields)


def spent(user, *, day: int = 0, month: int = 0) -> None:
    """`user` has already used these tokens in their current day and month (earlier
    turns): the periods started as a model call starts them, in the user's zone now."""
    now = timezone.now()
    spend_periods_start(user=user, now=now)
    for period, tokens in (("day", day), ("month", month)):
        SpendCounter.objects.filter(user=user, period=period, ends_at__gt=now).update(tokens=tokens)
