"""A tripped turn- or conversation-level limit becomes a stored question (seed 002 §7.4).

The turn is paused (no worker held), the pause records which limit, when, and what is
left; the assistant says what completed and what has not started. Continue raises the
tripped budget and resumes exactly where the turn stopped.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from orchestration import dispatches as lifecycle
from orchestration.events import event_record
from orchestration.history import message_append
from orchestration.limits import Limits, LimitTripped
from orchestration.models import DispatchState, Message, Turn, TurnPause, TurnStatus
from orchestration.tasks import enqueue_orchestrator_step

def turn_pause(*, turn_id: int, trip: LimitTripped, token: str | None = None) -> TurnPause | None:
    with transaction.atomic():
        turn = lifecycle.lock_turn(turn_id)
        if turn.status not in (TurnStatus.RUNNING, TurnStatus.WAITING):
            return None
        if token is not None and turn.status == TurnStatus.RUNNING and turn.lease_token not in ("", token):
            return None
        dispatches = list(turn.dispatches.all())
        detail = {
            **trip.detail,
            "message": trip.message,
            "completed": [d.agent_id for d in dispatches if lifecycle.succeeded(d)],
            "running": [d.agent_id for d in dispatches if d.state == DispatchState.RUNNING],
            "not_started": [d.agent_id for d in dispatches if d.state == DispatchState.CREATED],
            "budget_left": budget_left(turn),
            "resumes_at": trip.detail.get("resumes_at"),
        }
        try:
            with transaction.atomic():
                pause = TurnPause.objects.create(turn=turn, limit=trip.limit, detail=detail)
        except IntegrityError:
            return None  # already paused by a concurrent trip
        Turn.objects.filter(pk=turn.pk).update(
            status=TurnStatus.PAUSED, lease_token="", lease_expires_at=None, step_attempts=0, answer_draft="",
            # the waiting state is re-derived on resume, from the pending tool call
        )
        event_record(type="limit.tripped", turn=turn, summary=f"Limit tripped: {trip.limit}", payload=detail | {"limit": trip.limit})
        message_append(turn=turn, role=Message.Role.NOTICE, content=pause_question(trip.limit, detail))
        event_record(type="turn.paused", turn=turn, summary=f"Turn {turn.number} paused: continue?", payload={"pause_id": pause.pk, "limit": trip.limit})
    return pause


def budget_left(turn: Turn) -> dict:
    limits = Limits.from_json(turn.limits)
    return {
        "agents": max(0, limits.turn_max_agents - turn.agents_dispatched),
        "skill_calls": max(0, limits.turn_max_skill_calls - turn.skill_calls),
        "llm_iterations": max(0, limits.turn_max_llm_iterations - turn.llm_iterations),
    }


def pause_question(limit: str, detail: dict) -> str:
    def names(items):
        return ", ".join(items) if items else "none"

    lines = [
        f"**Paused — continue?** {detail['message']}",
        f"- Completed: {names(detail['completed'])}",
        f"- Not started yet: {names(detail['not_started'] + detail['running'])}",
    ]
    if detail.get("resumes_at"):
        lines.append(f"- The conversation's window frees up at {detail['resumes_at']}.")
    lines.append("\nContinue to grant a fresh budget and resume where it stopped, or Stop to end the turn.")
    return "\n".join(lines)


class AlreadyAnswered(Exception):
    """The pause was answered already (e.g. a second Continue click)."""


def turn_continue(*, turn: Turn, user) -> Turn:
    """Grant a fresh budget of the tripped kind and resume. Only the owner; only once."""
    from orchestration.turns import TurnRefused

    with transaction.atomic():
        turn = lifecycle.lock_turn(turn.pk)
        if turn.conversation.owner_id != user.pk:
            raise TurnRefused("Only the conversation's owner can continue this turn.")
        pause = TurnPause.objects.filter(turn=turn, decision="").first()
        if pause is None or turn.status != TurnStatus.PAUSED:
            raise AlreadyAnswered("This turn was already resumed or stopped.")
        if not TurnPause.objects.filter(pk=pause.pk, decision="").update(
            decision=TurnPause.Decision.CONTINUE, decided_by=user, decided_at=timezone.now()
        ):
            raise AlreadyAnswered("This turn was already resumed or stopped.")
        limits = Limits.from_json(turn.limits).to_json()
        if pause.limit in limits:
            # A fresh budget of the tripped kind: what was used so far plus one default's
            # worth (or what the tripping request asked for, if that is more).
            fresh = max(Limits.from_settings().to_json()[pause.limit], pause.detail.get("requested", 0))
            limits[pause.limit] = pause.detail.get("used", 0) + fresh
        Turn.objects.filter(pk=turn.pk).update(
            status=TurnStatus.RUNNING, limits=limits, continuations=F("continuations") + 1
        )
        # The owner's time to decide is not the agents': their wall clocks move on by it.
        turn.dispatches.filter(state__in=lifecycle.OPEN_STATES, deadline_at__isnull=False).update(
            deadline_at=F("deadline_at") + (timezone.now() - pause.tripped_at)
        )
        event_record(
            type="turn.resumed", turn=turn,
            summary=f"Turn {turn.number} resumed by {user.get_username()}",
            payload={"pause_id": pause.pk, "limit": pause.limit, "approved_by": user.get_username(),
                     "approved_at": timezone.now().isoformat(), "limits": limits},
        )
        turn.refresh_from_db()
        lifecycle.dispatch_schedule(turn)
        enqueue_orchestrator_step(turn.pk)
    return turn
