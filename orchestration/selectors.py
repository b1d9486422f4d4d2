"""Read-side queries used by the web layer and the commands."""

from __future__ import annotations

from django.db.models import QuerySet

from orchestration.models import Conversation, Message


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
