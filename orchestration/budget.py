"""Skill-call budgets shared by concurrent workers (DESIGN.md §5).

A reservation is taken in the transaction that opens the skill's execution row, just
before its handler runs, and commits with that row (skills/executor.py): a call that is
refused never counts, a replayed call (its row already open) never reserves twice, and
the turn and conversation rows are locked only for the reservation, not while the
handler runs. The turn counter is a conditional UPDATE (`WHERE skill_calls < limit`),
which the database applies one row-lock at a time: with 8 agents racing for the last 3
calls, exactly 3 updates match. The conversation's sliding window is counted under a
lock on the conversation row, for the same reason.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from orchestration.events import event_record
from orchestration.limits import Limits, LimitTripped
from orchestration.models import AgentDispatch, Conversation, Event, Turn

SKILL_STARTED = "skill.started"


def reserve_skill_call(*, dispatch: AgentDispatch, skill: str, arguments: dict) -> None:
    turn = dispatch.turn
    limits = Limits.from_json(Turn.objects.values_list("limits", flat=True).get(pk=turn.pk))
    taken = Turn.objects.filter(pk=turn.pk, skill_calls__lt=limits.turn_max_skill_calls).update(
        skill_calls=F("skill_calls") + 1
    )
    if not taken:
        raise LimitTripped(
            "turn_max_skill_calls",
            f"This turn used its {limits.turn_max_skill_calls} skill calls.",
            detail={"limit": limits.turn_max_skill_calls, "used": limits.turn_max_skill_calls},
        )
    _reserve_in_window(turn.conversation_id, limits)
    event_record(
        type=SKILL_STARTED, dispatch=dispatch, summary=f"{dispatch.agent_id} → {skill}",
        payload={"skill": skill, "arguments": arguments},
    )


def _reserve_in_window(conversation_id: int, limits: Limits) -> None:
    # NO KEY: rows inserted meanwhile that point at the conversation need only KEY SHARE.
    Conversation.objects.select_for_update(no_key=True).filter(pk=conversation_id).values_list("pk").first()
    since = timezone.now() - timedelta(seconds=limits.conversation_window_seconds)
    in_window = Event.objects.filter(conversation_id=conversation_id, type=SKILL_STARTED, created_at__gte=since)
    used = in_window.count()
    if used >= limits.conversation_max_skill_calls:
        oldest = in_window.order_by("created_at").values_list("created_at", flat=True).first()
        frees_at = oldest + timedelta(seconds=limits.conversation_window_seconds)
        raise LimitTripped(
            "conversation_max_skill_calls",
            f"This conversation made {used} skill calls in the last "
            f"{limits.conversation_window_seconds // 60 or 1} minutes (limit "
            f"{limits.conversation_max_skill_calls}).",
            detail={"limit": limits.conversation_max_skill_calls, "used": used,
                    "resumes_at": frees_at.isoformat()},
        )
