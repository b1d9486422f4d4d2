"""Turn services: start, complete, fail, stop (services write; views and commands call)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from orchestration.budgets.budget import calls_in_window
from orchestration.budgets.limits import Limits
from orchestration.delivery.leases import lease_until
from orchestration.delivery.queue import enqueue_orchestrator_step
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.lifecycle.refusals import TurnOver, TurnRefused  # noqa: F401 - raised here, imported from here
from orchestration.models import (
    ACTIVE_TURN_STATUSES,
    AgentDispatch,
    Conversation,
    DispatchOutcome,
    Message,
    SkillExecution,
    Turn,
    TurnPause,
    TurnStatus,
)
from orchestration.questions.pauses import pause_recorded
from orchestration.records.catalogue import TURN_COMPLETED, TURN_FAILED, TURN_STARTED, TURN_STOPPED
from orchestration.records.compiled import CompiledRead, CompiledUpdate, attnames, related_attnames
from orchestration.records.events import MAX_CARRIED_CHARS, event_record, group_notify
from orchestration.records.history import message_append
from orchestration.records.outside import conversation_outside_fold
from orchestration.reports import otel
from orchestration.reports.errors import failure_of
from orchestration.zones import user_time_zone
from skills import registry
from skills.base import Domain
from skills.models import ExecutionStatus
from skills.validation import unstorable_text

MAX_MESSAGE_CHARS = 8000


def turn_start(*, conversation: Conversation, text: str) -> Turn:
    """Store the user's message and start a turn. One active turn per conversation:
    a message sent while a turn runs is refused (not queued), so the user decides.

    The turn keeps the owner's time zone as it is now: its skills read "tomorrow at 2pm"
    and its prompts give the local time in that zone, even if the owner changes it later.
    It starts with the outside content its conversation carries (orchestration/records/outside.py):
    the history holds it."""
    text = (text or "").strip()
    if not text:
        raise TurnRefused("The message is empty.")
    if len(text) > MAX_MESSAGE_CHARS:
        raise TurnRefused(f"The message is {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}.")
    # A NUL character (a form post can carry one; so can `manage.py ask`, as can lone
    # surrogates from undecodable argv bytes) would crash PostgreSQL's INSERT with a 500.
    problem = unstorable_text(text)
    if problem:
        raise TurnRefused(f"The message cannot be stored: {problem}.")
    try:
        with transaction.atomic():
            locked = Conversation.objects.select_for_update(no_key=True).filter(pk=conversation.pk).first()
            if locked is None:  # its owner deleted it after the page loaded it
                raise TurnRefused("This conversation has been deleted.")
            if locked.turns.filter(status__in=ACTIVE_TURN_STATUSES).exists():
                raise TurnRefused(_BUSY)
            number = (locked.turns.aggregate(n=Max("number"))["n"] or 0) + 1
            limits = Limits.from_settings()
            turn = Turn.objects.create(
                conversation=locked, number=number, limits=limits.to_json(),
                prior_window_calls=calls_in_window(locked.pk, limits),
                # The owner as the caller has them (a page's request: read with the session).
                time_zone=user_time_zone(conversation.owner), outside=locked.outside,
            )
            message_append(turn=turn, role=Message.Role.USER, content=text)
            if not locked.title:
                locked.title = conversation_title(text)
            locked.save(update_fields=["title", "updated_at"])
            event_record(type=TURN_STARTED, turn=turn, summary=f"Turn {number} started", payload={"message": text[:2000]})
            enqueue_orchestrator_step(turn.pk)
    except IntegrityError:  # the partial unique index caught a concurrent start
        raise TurnRefused(_BUSY) from None
    return turn


TITLE_CHARS = 120  # the list shows one line of it and the rest on hover; the page, two


def conversation_title(text: str) -> str:
    """A short title from the first request: its first line, spaces collapsed, cut at a
    word before TITLE_CHARS (one line on a phone)."""
    line = " ".join(next((ln for ln in text.splitlines() if ln.strip()), "").split())
    if len(line) <= TITLE_CHARS:
        return line
    cut = line[:TITLE_CHARS].rsplit(" ", 1)[0] if " " in line[:TITLE_CHARS] else line[:TITLE_CHARS]
    return cut.rstrip(" ,.;:-–—") + "…"


_BUSY = "A turn is still running in this conversation. Wait for its answer, or stop it, before sending another message."


MAX_DRAFT_CHARS = 100_000


def turn_draft_save(*, turn: Turn, token: str, text: str) -> None:
    """Store the answer as far as it has streamed, and tell the turn's open pages.

    Not an event: the log keeps what happened, and the stored answer is the fact; a
    draft only shows progress (a reload shows it too). Written only while this worker
    holds the turn, so a stopped or taken-over turn shows no stale text; and it renews
    the lease, since text arriving is proof the call is alive (a long answer can take
    longer to write than a lease lasts). The message carries the draft, so an open page
    does not read it back."""
    text = text[:MAX_DRAFT_CHARS]
    if _drafting(pk=turn.pk, token=token, draft=text, until=lease_until()):
        message = {"type": "answer.streamed", "turn_id": turn.pk}
        if len(text) <= MAX_CARRIED_CHARS:  # a longer one is announced without it: the pages read it
            message["draft"] = text
        group_notify(turn.conversation_id, message)


def _finish(turn_id: int, token: str | None, *, status: str, error: str = "") -> Turn | None:
    """Conditionally end an active turn; None if someone else ended it first. Every
    ending passes here (answered, failed, dead-lettered, stopped), in its transaction:
    what the turn read of outside content goes to its conversation here."""
    sources = [TurnStatus.RUNNING] if status == TurnStatus.COMPLETED else ACTIVE_TURN_STATUSES
    held = {} if token is None else {"lease_token": token}
    if not lifecycle.turn_move(turn_id, source=sources, target=status, where=held, error=error,
                               finished_at=timezone.now(), lease_token="", lease_expires_at=None, awaiting={},
                               answer_draft=""):
        return None
    (turn,) = _ended_turn.instances(Turn, turn_id)
    conversation_outside_fold(turn=turn)
    otel.after_ending(turn_id)  # its trace, once this commits (when OTEL_* asks for one)
    return turn


# Every turn's end reads and writes these, and a streaming answer saves its draft every
# ASSISTANT_STREAM_INTERVAL_SECONDS: compiled once (orchestration/records/compiled.py).
_drafting = CompiledUpdate(lambda p: (Turn.objects.filter(pk=p.pk, lease_token=p.token, status=TurnStatus.RUNNING),
                                      {"answer_draft": p.draft, "lease_expires_at": p.until}))
_ended_turn = CompiledRead(lambda turn_id: Turn.objects.filter(pk=turn_id).order_by().values_list(
    *attnames(Turn), *related_attnames(Turn, "conversation")))
_conversation_touching = CompiledUpdate(lambda p: (Conversation.objects.filter(pk=p.pk), {"updated_at": p.at}))
_agent_outcomes = CompiledRead(lambda turn_id: AgentDispatch.objects.filter(turn_id=turn_id).order_by("id")
                               .values_list("agent_id", "outcome", "error", "close_reason"))
_calls_not_done = CompiledRead(lambda turn_id: SkillExecution.objects.filter(dispatch__turn_id=turn_id).exclude(
    status__in=[ExecutionStatus.COMPLETED, ExecutionStatus.RUNNING]).order_by("id").values_list("skill", "result"))
_calls_done = CompiledRead(lambda turn_id: SkillExecution.objects.filter(
    dispatch__turn_id=turn_id, status=ExecutionStatus.COMPLETED).order_by("finished_at", "id")
    .values_list("skill", "arguments", "result"))
_mcp_caller = CompiledRead(lambda turn_id: SkillExecution.objects.filter(
    dispatch__turn_id=turn_id, skill__startswith=registry.MCP_PREFIX).order_by("id")
    .values_list("dispatch__turn__conversation__owner_id")[:1])


def turn_complete(*, turn_id: int, token: str, answer: Message) -> None:
    domains = effect_domains(turn_id)
    with transaction.atomic():
        turn = _finish(turn_id, token, status=TurnStatus.COMPLETED)
        if turn is None:
            return
        lifecycle.turn_dispatches_close(turn, reason="the turn was answered before this agent finished")
        shortfall = shortfall_note(turn)
        if shortfall:  # the model's answer may claim more than happened: the record says what did not
            message_append(turn=turn, role=Message.Role.NOTICE, content=shortfall)
        if effects := side_effects_note(turn, domains):
            message_append(turn=turn, role=Message.Role.NOTICE, content=effects)
        event_record(
            type=TURN_COMPLETED, turn=turn, summary=f"Turn {turn.number} answered",
            payload={"answer_message_id": answer.pk, "llm_iterations": turn.llm_iterations,
                     "skill_calls": turn.skill_calls, "agents": turn.agents_dispatched,
                     "prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens},
        )
        turn.conversation.updated_at = timezone.now()
        _conversation_touching(pk=turn.conversation_id, at=turn.conversation.updated_at)


def shortfall_note(turn: Turn) -> str:
    """What did not go as asked, from the engine's own records (agents that did not
    complete, skill calls that failed), in a line or two; "" when everything did.

    Written by the engine after the model's answer, so the chat never shows a claim of
    success the audit contradicts."""
    agents = _agent_outcomes(turn.pk)
    missed = [(agent_id, outcome or "closed", error or reason) for agent_id, outcome, error, reason in agents
              if outcome != DispatchOutcome.COMPLETED]
    calls = _calls_not_done(turn.pk)
    declined = [skill for skill, result in calls if _declined(result)]  # the owner's word, not a failure
    unknown = [skill for skill, result in calls if _kind(result) == "in_doubt"]  # lost; may have happened
    failed_calls = [skill for skill, result in calls if not _declined(result) and _kind(result) != "in_doubt"]
    parts = []
    if missed:
        named = "; ".join(f"**{agent_id}** {outcome.replace('_', ' ')}" + (f" ({why[:160]})" if why else "")
                          for agent_id, outcome, why in missed[:5])
        more = f"; and {len(missed) - 5} more" if len(missed) > 5 else ""
        parts.append(f"{len(missed)} of {len(agents)} agent{'s' if len(agents) != 1 else ''} did not complete: "
                     f"{named}{more}.")
    if failed_calls:
        count = len(failed_calls)
        parts.append(f"{count} skill call{'s' if count != 1 else ''} failed ({', '.join(sorted(set(failed_calls)))}).")
    if declined:
        parts.append(f"You declined {', '.join(sorted(set(declined)))}, so it was not done.")
    if unknown:
        parts.append(f"Whether {', '.join(sorted(set(unknown)))} happened is not known: it was sent and its answer "
                     "was lost, and it was not sent again.")
    return ("From the engine's record: " + " ".join(parts)) if parts else ""


def _declined(result) -> bool:
    """A row the owner's Deny ended keeps the kind its agent was shown (skills/models.py)."""
    return _kind(result) == "denied"


def _kind(result) -> str:
    return result.get("error_kind", "") if isinstance(result, dict) else ""


def effect_domains(turn_id: int) -> dict[str, Domain]:
    """The skills a turn's side effects are described by, found before its ending's
    transaction: with an MCP tool among its calls, its server's tool list may have to be
    fetched (the server's process started, or its network waited on, up to its
    timeouts), which must not happen while the turn's row (on SQLite, the database's one
    writer) is locked. One statement when the turn called no MCP tool."""
    owner_id = next((owner_id for owner_id, in _mcp_caller(turn_id)), None)
    return registry.domains_for(get_user_model().objects.get(pk=owner_id) if owner_id else None)


def side_effects(turn: Turn, domains: dict[str, Domain]) -> list[str]:
    """What the turn changed or sent, one line each, from its completed skill calls that
    are not read-only (nested ones included), in the order they ran. A tool of an MCP
    server that is down now is listed by its name: what it did is not known to be nothing."""
    lines = []
    for name, arguments, result in _calls_done(turn.pk):
        skill = registry.skill_in(domains, name)
        if skill is None:
            if name.startswith(registry.MCP_PREFIX):
                lines.append(f"{name} (its server is not reachable now to describe it)")
            continue
        if not skill.read_only:
            lines.append(skill.effect_line(arguments or {}, result))
    return lines


def side_effects_note(turn: Turn, domains: dict[str, Domain]) -> str:
    """Written by the engine under every turn that had any, whatever the model said;
    "" when it had none."""
    lines = side_effects(turn, domains)
    if not lines:
        return ""
    return "Side effects (from the engine's record):\n" + "\n".join(f"- {line}" for line in lines)


def turn_fail(*, turn_id: int, error: str, token: str | None = None) -> None:
    domains = effect_domains(turn_id)
    with transaction.atomic():
        turn = _finish(turn_id, token, status=TurnStatus.FAILED, error=error)
        if turn is None:
            return
        lifecycle.turn_dispatches_close(turn, reason="the turn failed")
        effects = side_effects_note(turn, domains)
        words = failure_of(error).words  # the whole error stays in the turn, its event and the audit
        message_append(turn=turn, role=Message.Role.NOTICE,
                       content=f"Sorry — this turn failed. {words}" + (f"\n\n{effects}" if effects else ""))
        event_record(type=TURN_FAILED, turn=turn, summary=f"Turn {turn.number} failed: {words[:200]}",
                     payload={"error": error})


def turn_stop(*, turn: Turn, user) -> Turn:
    """Stop an active turn on the owner's word: cancel its agents, answer with a summary."""
    domains = effect_domains(turn.pk)
    with transaction.atomic():
        return _turn_stop(turn, user, domains)


def _turn_stop(turn: Turn, user, domains: dict[str, Domain]) -> Turn:
    turn = lifecycle.lock_turn(turn.pk)
    if turn.conversation.owner_id != user.pk:
        raise TurnRefused("Only the conversation's owner can stop this turn.")
    if not turn.is_active:
        raise TurnOver(f"The turn had already {_ENDED.get(turn.status, turn.status)} before the Stop reached it.")
    open_pause = TurnPause.objects.filter(turn=turn, decision="").values_list("pk", flat=True).first()
    if open_pause is not None:  # one at most (one_open_pause_per_turn)
        TurnPause.objects.filter(pk=open_pause).update(
            decision=TurnPause.Decision.STOP, decided_by=user, decided_at=timezone.now())
        pause_recorded(open_pause)
    _finish(turn.pk, None, status=TurnStatus.STOPPED)
    lifecycle.turn_dispatches_close(turn, reason="stopped by the owner")
    summary = stop_summary(turn)
    if effects := side_effects_note(turn, domains):
        summary += f"\n\n{effects}"
    message_append(turn=turn, role=Message.Role.NOTICE, content=summary)
    event_record(type=TURN_STOPPED, turn=turn, summary=f"Turn {turn.number} stopped by {user.get_username()}",
                 payload={"stopped_by": user.get_username(), "summary": summary})
    return turn


_ENDED = {TurnStatus.COMPLETED: "been answered", TurnStatus.FAILED: "failed", TurnStatus.STOPPED: "been stopped"}


def stop_summary(turn: Turn) -> str:
    """What was done; and the answer as far as it had streamed (`turn` read before the
    Stop cleared its draft): the owner read it on the page, and it stays in the chat."""
    done = [d.agent_id for d in turn.dispatches.all() if lifecycle.succeeded(d)]
    lines = ["Stopped at your request."]
    lines.append(f"Completed: {', '.join(done)}." if done else "No agent had completed.")
    summary = " ".join(lines)
    if turn.answer_draft.strip():
        summary += f"\n\nThe answer so far:\n\n{turn.answer_draft}"
    return summary
