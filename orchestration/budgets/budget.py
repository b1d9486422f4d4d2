"""Skill-call budgets shared by concurrent workers (DESIGN.md §5).

A reservation is taken in the transaction that opens the skill's execution row, just
before its handler runs, and commits with that row (skills/executor.py): a call that is
refused never counts, a replayed call (its row already open) never reserves twice, and
the turn and conversation rows are locked only for the reservation, not while the
handler runs. The turn counter is a conditional UPDATE (`WHERE skill_calls < limit`),
which the database applies one row-lock at a time: with 8 agents racing for the last 3
calls, exactly 3 updates match.

The conversation's sliding window need not be counted on every call. A conversation has
one active turn at a time, so the calls in the window are at most those it held when
this turn started (`Turn.prior_window_calls`, which can only age out) plus this turn's
own: while that sum is under the limit, the one conditional UPDATE of the turn's counter
(which also checks the agent's lease) is the whole reservation. Near the limit, the window is counted exactly, under a lock
on the conversation row.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from orchestration.budgets.limits import Limits, LimitTripped
from orchestration.delivery.leases import heartbeat
from orchestration.models import AgentDispatch, Conversation, DispatchState, Event, Turn
from orchestration.records.catalogue import SKILL_STARTED
from orchestration.records.events import event_new, events_record


def reserve_skill_call(*, dispatch: AgentDispatch, skill: str, arguments: dict, token: str | None = None) -> None:
    """Take one skill call of the turn's and the conversation's budgets, or trip a limit
    (LimitTripped). With `token`, only while the agent still holds its lease (LeaseLost)."""
    if not _reserve_quickly(dispatch, token):
        if token is not None:
            heartbeat(AgentDispatch, dispatch.pk, token)
        limits = Limits.from_json(Turn.objects.values_list("limits", flat=True).get(pk=dispatch.turn_id))
        taken = Turn.objects.filter(pk=dispatch.turn_id, skill_calls__lt=limits.turn_max_skill_calls).update(
            skill_calls=F("skill_calls") + 1
        )
        if not taken:
            raise LimitTripped(
                "turn_max_skill_calls",
                f"This turn used its {limits.turn_max_skill_calls} skill calls.",
                detail={"limit": limits.turn_max_skill_calls, "used": limits.turn_max_skill_calls},
            )
        _reserve_in_window(dispatch.turn.conversation_id, limits)
    events_record([skill_started_event(dispatch, skill, arguments)])


def skill_started_event(dispatch: AgentDispatch, skill: str, arguments: object) -> Event:
    """The event that counts a skill call in the conversation's window (not saved yet)."""
    return event_new(type=SKILL_STARTED, dispatch=dispatch, summary=f"{dispatch.agent_id} → {skill}",
                     payload={"skill": skill, "arguments": arguments})


def _reserve_quickly(dispatch: AgentDispatch, token: str | None) -> bool:
    """The reservation in one UPDATE, when far enough from every limit (see above).

    The limits are those the agent read with its turn: a Continue only raises them, so
    a raised limit at worst sends this call to the exact path, which reads them again."""
    limits = Limits.from_json(dispatch.turn.limits)
    room = Turn.objects.filter(
        pk=dispatch.turn_id, skill_calls__lt=limits.turn_max_skill_calls,
    ).filter(skill_calls__lt=limits.conversation_max_skill_calls - F("prior_window_calls"))
    if token is not None:
        # EXISTS, not a join: Django turns a joined UPDATE into `pk IN (subquery)`, whose
        # counter check PostgreSQL does not re-read after waiting on a concurrent
        # reservation's row lock, so eight racing agents could all take the last call.
        room = room.filter(Exists(AgentDispatch.objects.filter(
            pk=dispatch.pk, turn_id=OuterRef("pk"), lease_token=token, state=DispatchState.RUNNING,
        )))
    return bool(room.update(skill_calls=F("skill_calls") + 1))


def calls_in_window(conversation_id: int, limits: Limits) -> int:
    """The conversation's skill calls in the sliding window now (a turn's carry at start)."""
    since = timezone.now() - timedelta(seconds=limits.conversation_window_seconds)
    return Event.objects.filter(conversation_id=conversation_id, type=SKILL_STARTED, created_at__gte=since).count()


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
