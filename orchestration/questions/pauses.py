"""A tripped turn- or conversation-level limit becomes a stored question (seed 002 §7.4).

The turn is paused (no worker held), the pause records which limit, when, and what is
left; the assistant says what completed and what has not started. Continue raises the
tripped budget and resumes exactly where the turn stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import formats, timezone

from orchestration.budgets.limits import LIMIT_WORDS, Limits, LimitTripped
from orchestration.budgets.spending import CAP_GRANT, SPEND_CAP, cap_label, cap_reached_words, spend_blocked
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.lifecycle.refusals import TurnRefused
from orchestration.models import WORKING_TURN_STATUSES, DispatchState, Message, Turn, TurnPause, TurnStatus
from orchestration.records.catalogue import LIMIT_TRIPPED, TURN_PAUSED, TURN_RESUMED
from orchestration.records.events import event_record
from orchestration.records.history import message_append
from orchestration.reports import otel

APPROVAL = "approval"  # the limit of an approval's pause (orchestration/questions/approvals.py)


def turn_pause(*, turn_id: int, trip: LimitTripped, token: str | None = None,
               releasing: int | None = None) -> TurnPause | None:
    """Pause the turn on `trip`. `token`: the orchestrator's, when it trips the limit
    itself; `releasing`: the agent that tripped it, given back in the same transaction
    (it waits to start again, it is not still working)."""
    with transaction.atomic():
        turn = lifecycle.lock_turn(turn_id)
        if turn.status not in WORKING_TURN_STATUSES:
            return None
        if token is not None and turn.status == TurnStatus.RUNNING and turn.lease_token not in ("", token):
            return None
        dispatches = list(turn.dispatches.all())
        detail = {
            **trip.detail,
            "message": trip.message,
            "completed": [d.agent_id for d in dispatches if lifecycle.succeeded(d)],
            "running": [d.agent_id for d in dispatches if d.state == DispatchState.RUNNING and d.pk != releasing],
            "not_started": [d.agent_id for d in dispatches
                            if d.state == DispatchState.CREATED or (d.pk == releasing and d.state == DispatchState.RUNNING)],
            "budget_left": budget_left(turn),
            "resumes_at": trip.detail.get("resumes_at"),
            # Continue's fresh budgets are bounded per turn (turn_max_continues).
            "continues_left": max(0, Limits.from_json(turn.limits).turn_max_continues - turn.continuations),
        }
        try:
            with transaction.atomic():
                pause = TurnPause.objects.create(turn=turn, limit=trip.limit, detail=detail)
        except IntegrityError:
            return None  # already paused by a concurrent trip
        trip.record(pause)
        # The waiting state is re-derived on resume, from the pending tool call. An
        # orchestrator in the middle of a model call keeps its lease (its answer is paid
        # for and will be stored); it lets go at its next step, or goes on if the owner
        # has pressed Continue by then.
        held = {"lease_token": "", "lease_expires_at": None} if token is not None else {}
        lifecycle.turn_move(turn.pk, source=turn.status, target=TurnStatus.PAUSED, answer_draft="", **held)
        event_record(type=LIMIT_TRIPPED, turn=turn, summary=trip.summary(pause_words_of(pause).label),
                     payload=detail | {"limit": trip.limit})
        # A one-line record in the chat, at the turn's place, which the answer completes;
        # the question itself, with its buttons, is the prompt panel (one prompt per pause).
        message_append(turn=turn, role=Message.Role.NOTICE, content=pause_record(pause))
        question = "approve?" if trip.limit == APPROVAL else "continue?"
        event_record(type=TURN_PAUSED, turn=turn, summary=f"Turn {turn.number} paused: {question}",
                     payload={"pause_id": pause.pk, "limit": trip.limit})
        otel.after_pausing(turn.pk)  # the run that ended, once this commits (when OTEL_* asks)
    return pause


def budget_left(turn: Turn) -> dict:
    limits = Limits.from_json(turn.limits)
    return {
        "agents": max(0, limits.turn_max_agents - turn.agents_dispatched),
        "skill_calls": max(0, limits.turn_max_skill_calls - turn.skill_calls),
        "llm_iterations": max(0, limits.turn_max_llm_iterations - turn.llm_iterations),
        "agent_llm_calls": max(0, limits.turn_max_llm_calls - turn.agent_llm_calls),
    }


def continue_grant(limit: str, detail: dict) -> int:
    """How many more of the tripped kind Continue allows: one default's worth, or what
    the tripping request asked for if that is more."""
    return max(Limits.from_settings().to_json()[limit], detail.get("requested", 0))


def _count(n: int, words) -> str:
    if not n:
        return f"no {words.many}"
    return f"{n} {words.one if n == 1 else words.many}"


def _window(seconds: int) -> str:
    minutes = seconds // 60
    if minutes < 1:
        return f"{seconds} seconds"
    return "minute" if minutes == 1 else f"{minutes} minutes"


@dataclass(frozen=True)
class PauseWords:
    """A pause as the owner reads it: which limit, what is done, what waits, what Continue grants."""

    label: str
    reached: str
    done: list[str]
    working: list[str]
    waiting: list[str]
    grant: str
    frees_at: str


def pause_words(limit: str, detail: dict) -> PauseWords:
    words = LIMIT_WORDS.get(limit)
    window = _window(int(Limits.from_settings().conversation_window_seconds))
    frees_at = ""
    if detail.get("resumes_at"):
        at = timezone.localtime(datetime.fromisoformat(detail["resumes_at"]))
        frees_at = formats.time_format(at, "H:i")
    done = list(detail.get("completed", []))
    working = list(detail.get("running", []))
    waiting = [*detail.get("asked_for", []), *detail.get("not_started", [])]
    if limit == SPEND_CAP:  # the user's allowance: Continue grants nothing past it
        return PauseWords(label=cap_label(detail), reached=cap_reached_words(detail), done=done, working=working,
                          waiting=waiting, grant=CAP_GRANT, frees_at="")
    if words is None:  # a question this module has no words for: say what is stored
        return PauseWords(label=limit.replace("_", " "), reached=detail.get("message", ""), done=done,
                          working=working, waiting=waiting, grant="", frees_at=frees_at)
    counts = {key: _count(int(detail.get(key, 0) or 0), words) for key in ("limit", "used", "requested")}
    more = continue_grant(limit, detail)
    grant = f"Continue allows {more} more {words.one if more == 1 else words.many} for this turn."
    if detail.get("continues_left") == 0:
        grant = CONTINUES_SPENT
    return PauseWords(
        label=words.label.format(window=window),
        reached=words.reached.format(**counts, window=window),
        done=done, working=working, waiting=waiting, grant=grant, frees_at=frees_at,
    )


def pause_label(pause: TurnPause) -> str:
    """What the turn paused on, as the audit and the admin name it: "agents per turn",
    "approval of email.send"."""
    if pause.limit == APPROVAL:
        approval = getattr(pause, "approval", None)
        if approval is not None and approval.in_doubt:
            return f"a call of {approval.skill} in doubt"
        return f"approval of {approval.skill}" if approval is not None else "an approval"
    return pause_words(pause.limit, pause.detail).label


def pause_answer(pause: TurnPause) -> str:
    """How the question was answered, in the owner's terms: an approval is approved or
    denied (its pause only says the turn went on), a limit continued or stopped."""
    if not pause.decision:
        return "waiting for the owner"
    if pause.decision == TurnPause.Decision.STOP:
        return "stopped"
    approval = getattr(pause, "approval", None) if pause.limit == APPROVAL else None
    if approval is not None and approval.decision:
        words = approval.decision_words()  # "approved", "denied"; "send it again", "go on as if it failed"
        return f"chose to {words}" if approval.in_doubt else words
    return "continued"


def pause_record(pause: TurnPause, *, answered: bool = True) -> str:
    """The pause's line in the chat: what the turn paused on, and once answered, the
    answer ("Turn 2 paused on approval of email.send: alice approved it.")."""
    line = f"Turn {pause.turn.number} paused on {pause_label(pause)}"
    if not (pause.decision and answered):
        return f"{line}: waiting for your answer below."
    who = pause.decided_by.get_username() if pause.decided_by else "someone"
    answer = pause_answer(pause)
    return f"{line}: {who} {answer}." if answer.startswith("chose") else f"{line}: {who} {answer} it."


def pause_recorded(pause_id: int) -> None:
    """Complete the pause's line in the chat with its answer (in the answer's
    transaction). The line waiting for it is the earliest with its words: one pause is
    open at a time."""
    pause = TurnPause.objects.select_related("turn", "decided_by", "approval").get(pk=pause_id)
    waiting = pause_record(pause, answered=False)
    line = Message.objects.filter(turn=pause.turn, role=Message.Role.NOTICE, content=waiting).order_by("seq").first()
    if line is not None:
        Message.objects.filter(pk=line.pk).update(content=pause_record(pause))


CONTINUES_SPENT = "This turn has been continued as many times as one turn may be: Continue is not possible."


def pause_words_of(pause: TurnPause) -> PauseWords:
    """A pause's question in plain words (pages show it through the `question` filter)."""
    return pause_words(pause.limit, pause.detail)


def pause_question(limit: str, detail: dict) -> str:
    """The continue? prompt as text (manage.py ask prints it)."""
    words = pause_words(limit, detail)

    def names(items):
        return ", ".join(items) if items else "nothing yet"

    lines = [f"**Paused — continue?** {words.reached}", f"- Done: {names(words.done)}"]
    if words.working:
        lines.append(f"- Still working: {', '.join(words.working)}")
    if words.waiting:
        lines.append(f"- Waiting to start: {', '.join(words.waiting)}")
    if words.frees_at:
        lines.append(f"- The conversation's window frees up at {words.frees_at}.")
    lines.append("\n" + " ".join(filter(None, [words.grant, "Stop ends the turn with what is done."])))
    return "\n".join(lines)


class AlreadyAnswered(Exception):
    """The pause was answered already (e.g. a second Continue click)."""


def turn_continue(*, turn: Turn, user) -> Turn:
    """Grant a fresh budget of the tripped kind and resume. Only the owner; only once."""
    with transaction.atomic():
        turn = lifecycle.lock_turn(turn.pk)
        if turn.conversation.owner_id != user.pk:
            raise TurnRefused("Only the conversation's owner can continue this turn.")
        pause = TurnPause.objects.filter(turn=turn, decision="").first()
        if pause is None or turn.status != TurnStatus.PAUSED:
            raise AlreadyAnswered("This turn was already resumed or stopped.")
        if pause.limit == APPROVAL:
            raise AlreadyAnswered("This question is answered with Approve or Deny.")
        if pause.limit == SPEND_CAP:
            # Nothing to grant: the turn goes on once the allowance covers its next call.
            if problem := spend_blocked(user=turn.conversation.owner, detail=pause.detail):
                raise TurnRefused(problem)
            return turn_resume(turn=turn, pause=pause, user=user)
        allowed = Limits.from_json(turn.limits).turn_max_continues
        if turn.continuations >= allowed:
            raise TurnRefused(
                f"This turn has been continued {turn.continuations} time{'s' if turn.continuations != 1 else ''}, "
                f"the most one turn may be ({allowed}). Stop ends it with what is done; a new message starts "
                "a fresh turn.")
        limits = Limits.from_json(turn.limits).to_json()
        if pause.limit in limits:
            # A fresh budget of the tripped kind: what was used so far plus the grant.
            limits[pause.limit] = pause.detail.get("used", 0) + continue_grant(pause.limit, pause.detail)
        return turn_resume(turn=turn, pause=pause, user=user, limits=limits)


def turn_resume(*, turn: Turn, pause: TurnPause, user, limits: dict | None = None) -> Turn:
    """Answer `pause` (continue) and run the turn again where it stopped, with `limits`
    if given. The caller holds the turn lock and checked the owner."""
    with transaction.atomic():
        if not TurnPause.objects.filter(pk=pause.pk, decision="").update(
            decision=TurnPause.Decision.CONTINUE, decided_by=user, decided_at=timezone.now()
        ):
            raise AlreadyAnswered("This turn was already resumed or stopped.")
        pause_recorded(pause.pk)
        limits = limits if limits is not None else turn.limits
        lifecycle.turn_move(
            turn.pk, source=TurnStatus.PAUSED, target=TurnStatus.RUNNING, limits=limits, queued_at=None,
            # Only a fresh budget counts toward turn_max_continues (an approval or a
            # renewed allowance grants none).
            continuations=F("continuations") + (0 if pause.limit in (APPROVAL, SPEND_CAP) else 1),
        )
        # The owner's time to decide is not the agents': their wall clocks move on by it.
        turn.dispatches.filter(state__in=lifecycle.OPEN_STATES, deadline_at__isnull=False).update(
            deadline_at=F("deadline_at") + (timezone.now() - pause.tripped_at)
        )
        event_record(
            type=TURN_RESUMED, turn=turn,
            summary=f"Turn {turn.number} resumed by {user.get_username()}",
            payload={"pause_id": pause.pk, "limit": pause.limit, "approved_by": user.get_username(),
                     "approved_at": timezone.now().isoformat(), "limits": limits},
        )
        turn.refresh_from_db()
        lifecycle.dispatch_schedule(turn)  # the orchestrator, and every agent given back meanwhile
    return turn
