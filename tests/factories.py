"""Plain builders for engine rows: the one place tests make conversations, turns and dispatches."""

from __future__ import annotations

from orchestration.models import AgentDispatch, Conversation, Turn


def conversation_for(user, *, title: str = "Test conversation") -> Conversation:
    return Conversation.objects.create(owner=user, title=title)


def turn_for(conversation: Conversation, **fields) -> Turn:
    number = conversation.turns.count() + 1
    return Turn.objects.create(conversation=conversation, number=number, **fields)


def dispatch_for(turn: Turn, agent_id: str = "a1", **fields) -> AgentDispatch:
    fields.setdefault("mission", f"Mission of {agent_id}")
    return AgentDispatch.objects.create(turn=turn, agent_id=agent_id, **fields)
