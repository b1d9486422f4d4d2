"""The orchestrator's message history, stored as Message rows and sent in Chat Completions shape."""

from __future__ import annotations

from django.db.models import Max, Q, Subquery
from django.db.models.functions import Coalesce

from orchestration.models import Message, Turn

ENGINE_NOTE_PREFIX = "[engine note] "


def message_append(*, turn: Turn, role: str, content: str = "", tool_calls=None, tool_call_id: str = "") -> Message:
    """Append to the conversation; only the turn's lease holder writes, so seq is safe."""
    (message,) = messages_append(turn=turn, messages=[
        {"role": role, "content": content, "tool_calls": tool_calls or [], "tool_call_id": tool_call_id}])
    return message


def messages_append(*, turn: Turn, messages: list[dict]) -> list[Message]:
    """Append several in one INSERT (a batch of dispatch_agent answers, say), in order.

    Their `seq` is numbered by the INSERT itself, after the conversation's last (every row's
    subquery sees the table as the statement began): no read of the last one before. The
    messages returned read their `seq` back only if asked (a deferred field)."""
    last = Coalesce(Subquery(Message.objects.filter(conversation_id=turn.conversation_id).order_by()
                             .values("conversation_id").annotate(last=Max("seq")).values("last")), 0)
    created = Message.objects.bulk_create([
        Message(conversation_id=turn.conversation_id, turn=turn, seq=last + index, **fields)
        for index, fields in enumerate(messages, start=1)
    ])
    for message in created:
        del message.__dict__["seq"]  # the expression, not the number: loaded when read
    return created


def llm_messages(*, turn: Turn, system_prompt: str) -> list[dict]:
    """Earlier turns contribute their questions and answers; this turn everything.

    Tool traffic of earlier turns stays out: it is in the audit trail, and sending it
    again would spend the context window on results the answers already summarise. It is
    not read either: before every orchestrator call, that read would grow with every turn
    the conversation had.
    """
    messages: list[dict] = [{"role": "system", "content": system_prompt}]
    rows = Message.objects.filter(conversation_id=turn.conversation_id, turn__number__lte=turn.number).filter(
        Q(turn_id=turn.pk) | Q(role__in=(Message.Role.USER, Message.Role.ASSISTANT)))
    for row in rows.exclude(role=Message.Role.NOTICE).order_by("seq"):
        if row.turn_id != turn.pk:
            if row.role == Message.Role.USER or (row.role == Message.Role.ASSISTANT and not row.tool_calls and row.content):
                messages.append({"role": row.role, "content": row.content})
            continue
        messages.append(_as_llm_message(row))
    return messages


def _as_llm_message(row: Message) -> dict:
    if row.role == Message.Role.TOOL:
        return {"role": "tool", "tool_call_id": row.tool_call_id, "content": row.content}
    if row.role == Message.Role.NOTE:
        return {"role": "user", "content": ENGINE_NOTE_PREFIX + row.content}
    message: dict = {"role": row.role, "content": row.content or None}
    if row.tool_calls:
        message["tool_calls"] = row.tool_calls
    return message


def pending_tool_calls(turn: Turn) -> tuple[Message | None, list[dict]]:
    """The last assistant message's tool calls that have no result yet."""
    last = turn.messages.filter(role=Message.Role.ASSISTANT).order_by("-seq").first()
    if last is None or not last.tool_calls:
        return last, []
    answered = set(
        turn.messages.filter(role=Message.Role.TOOL, seq__gt=last.seq).values_list("tool_call_id", flat=True)
    )
    return last, [call for call in last.tool_calls if call["id"] not in answered]
