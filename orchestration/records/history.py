"""The orchestrator's message history, stored as Message rows and sent in Chat Completions shape."""

from __future__ import annotations

from django.db import connection
from django.db.models import Q

from orchestration.models import Message, Turn
from orchestration.records.compiled import CompiledRead, attnames
from orchestration.records.inserts import insert

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
    created = [Message(conversation_id=turn.conversation_id, turn=turn, **fields) for fields in messages]
    insert(created, MESSAGE_FIELDS, computed={"seq": _numbered(turn.conversation_id)})
    for message in created:
        del message.__dict__["seq"]  # numbered by the statement: loaded when read
    return created


MESSAGE_FIELDS = ("conversation", "turn", "seq", "role", "content", "tool_calls", "tool_call_id", "created_at")


def _numbered(conversation_id: int):
    """Each message's `seq`: the conversation's last before the statement, plus its place
    in the statement (a later statement of a long batch sees the earlier one's rows)."""
    table, seq, conversation = (connection.ops.quote_name(name) for name in
                                (Message._meta.db_table, "seq", Message._meta.get_field("conversation").column))
    last = f"(SELECT COALESCE(MAX({seq}), 0) FROM {table} WHERE {conversation} = %s)"  # nosec B608 - names, quoted
    return lambda message, position: (f"{last} + {position + 1:d}", [conversation_id])


# Read before every orchestrator call: compiled once.
_history = CompiledRead(lambda conversation_id, number, turn_id: Message.objects.filter(
    conversation_id=conversation_id, turn__number__lte=number,
).filter(Q(turn_id=turn_id) | Q(role__in=(Message.Role.USER, Message.Role.ASSISTANT)))
    .exclude(role=Message.Role.NOTICE).order_by("seq").values_list(*attnames(Message)), arity=3)


def llm_messages(*, turn: Turn, system_prompt: str) -> list[dict]:
    """Earlier turns contribute their questions and answers; this turn everything.

    Tool traffic of earlier turns stays out: it is in the audit trail, and sending it
    again would spend the context window on results the answers already summarise. It is
    not read either: before every orchestrator call, that read would grow with every turn
    the conversation had.
    """
    messages: list[dict] = [{"role": "system", "content": system_prompt}]
    for row in _history.instances(Message, turn.conversation_id, turn.number, turn.pk):
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
