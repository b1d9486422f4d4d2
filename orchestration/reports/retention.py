"""Retention and deletion: the only paths by which the audit trail loses rows.

Events are append-only (orchestration/models.py): nothing updates them, and they leave
only inside `retention_deleting()`, which this module alone enters, on three paths:

- `turns_prune`: `manage.py prune` ages out finished turns older than the window. A
  pruned turn keeps its row with a tombstone (counts, tokens, cost, dates), its agents'
  rows with their counters but not their missions, results or transcripts, and its LLM
  calls with their tokens and cost but not their responses: every usage figure (the
  pages, the admin, the export, any per-user spend) sums LLMCall rows, so they stay
  right without knowing about pruning. Its messages, skill executions (arguments and
  results), approvals, pauses and events go.
- `conversation_delete`: the owner deletes a conversation and everything in it.
- `user_delete`: a superuser deletes a user with everything of theirs, their workspace
  directory included.

Running, waiting and paused turns are never touched: pruning takes finished turns only,
and a conversation with an active turn cannot be deleted until the turn is stopped.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import OperationalError, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from orchestration.budgets.usage import turn_spend
from orchestration.delivery.dbretry import rolled_back_by_server
from orchestration.models import (
    ACTIVE_TURN_STATUSES,
    AgentDispatch,
    Conversation,
    Event,
    LLMCall,
    Message,
    SkillApproval,
    SkillExecution,
    Turn,
    TurnPause,
    TurnStatus,
    retention_deleting,
)
from skills.domains.files.workspace import workspace_root

logger = logging.getLogger(__name__)

FINISHED_TURN_STATUSES = (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.STOPPED)
DELETION_ATTEMPTS = 5  # a deletion rolled back as a deadlock with a running turn's step


class DeletionRefused(Exception):
    """A deletion that would lose something it must not (a turn still running)."""


# --- the window ---------------------------------------------------------------------

_AGE = re.compile(r"^\s*(\d{1,6})\s*([dh])\s*$")


def age_parse(text: str) -> timedelta:
    """ "90d" or "36h" → a timedelta; anything else is a ValueError saying what is accepted."""
    match = _AGE.match(text or "")
    if not match or int(match[1]) == 0:
        raise ValueError(f"{text!r} is not an age: write a whole number of days or hours, e.g. 90d or 36h")
    number, unit = int(match[1]), match[2]
    return timedelta(days=number) if unit == "d" else timedelta(hours=number)


def retention_cutoff(*, older_than: timedelta | None = None, now: datetime | None = None) -> datetime:
    """Turns that finished before this instant are past the window (the setting's by default)."""
    window = older_than if older_than is not None else timedelta(days=settings.ASSISTANT_RETENTION_DAYS)
    return (now or timezone.now()) - window


def turns_prunable(*, cutoff: datetime) -> QuerySet[Turn]:
    """Finished turns past the window, not yet pruned, oldest id first. Active turns
    (running, waiting, paused) are never among them, whatever their age."""
    finished_before = Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, started_at__lt=cutoff)
    return (Turn.objects.filter(finished_before, status__in=FINISHED_TURN_STATUSES, pruned_at__isnull=True)
            .order_by("pk"))


# --- pruning --------------------------------------------------------------------------

@dataclass
class PruneCounts:
    """What a batch of pruning removed (or, in a dry run, would remove)."""

    turns: int = 0
    messages: int = 0
    agents: int = 0
    skill_calls: int = 0
    events: int = 0
    llm_responses: int = 0
    approvals: int = 0
    pauses: int = 0
    conversations: set = field(default_factory=set)

    def __iadd__(self, other: PruneCounts) -> PruneCounts:
        for name in ("turns", "messages", "agents", "skill_calls", "events", "llm_responses", "approvals", "pauses"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.conversations |= other.conversations
        return self

    def words(self) -> str:
        def n(count: int, what: str) -> str:
            return f"{count} {what}" if count == 1 else f"{count} {what}s"

        return (f"{n(self.turns, 'turn')} in {n(len(self.conversations), 'conversation')}: "
                f"{n(self.messages, 'message')}, {n(self.events, 'event')}, {n(self.skill_calls, 'skill call')}, "
                f"{n(self.llm_responses, 'LLM response')}, {n(self.agents, 'agent transcript')}, "
                f"{n(self.approvals, 'approval')}, {n(self.pauses, 'pause')}")


def _counts_by_turn(queryset: QuerySet, turn_path: str, turn_ids: list[int]) -> dict[int, int]:
    rows = queryset.filter(**{f"{turn_path}__in": turn_ids}).order_by().values(turn_path).annotate(n=Count("pk"))
    return {row[turn_path]: row["n"] for row in rows}


def _tombstones(turns: list[Turn], *, now: datetime) -> dict[int, dict]:
    """Each turn's tombstone: what it held, so its figures outlive its transcript."""
    ids = [turn.pk for turn in turns]
    counts = {
        "messages": _counts_by_turn(Message.objects, "turn_id", ids),
        "agents": _counts_by_turn(AgentDispatch.objects, "turn_id", ids),
        "skill_calls": _counts_by_turn(SkillExecution.objects, "dispatch__turn_id", ids),
        "events": _counts_by_turn(Event.objects, "turn_id", ids),
        "llm_calls": _counts_by_turn(LLMCall.objects, "turn_id", ids),
        "approvals": _counts_by_turn(SkillApproval.objects, "turn_id", ids),
        "pauses": _counts_by_turn(TurnPause.objects, "turn_id", ids),
    }
    tombstones = {}
    for turn in turns:
        usage = turn_spend(turn).total.to_json()
        tombstones[turn.pk] = {
            **{name: by_turn.get(turn.pk, 0) for name, by_turn in counts.items()},
            "usage": usage, "tokens": usage["prompt_tokens"] + usage["completion_tokens"], "cost_usd": usage["cost_usd"],
            "status": turn.status, "started_at": turn.started_at.isoformat(),
            "finished_at": turn.finished_at.isoformat() if turn.finished_at else None,
            "pruned_at": now.isoformat(),
        }
    return tombstones


def turns_prune(*, turn_ids: list[int], cutoff: datetime, dry_run: bool = False) -> PruneCounts:
    """Prune these turns (one batch, one transaction), re-checked under lock: a turn that
    is active, inside the window or already pruned is left alone, so a second run, or a
    run beside another, does nothing twice."""
    now = timezone.now()
    with transaction.atomic():
        turns = list(turns_prunable(cutoff=cutoff).filter(pk__in=turn_ids).select_for_update(of=("self",)))
        if not turns:
            return PruneCounts()
        tombstones = _tombstones(turns, now=now)
        ids = [turn.pk for turn in turns]
        report = PruneCounts(turns=len(turns), conversations={turn.conversation_id for turn in turns})
        for stone in tombstones.values():
            report.messages += stone["messages"]
            report.agents += stone["agents"]
            report.skill_calls += stone["skill_calls"]
            report.events += stone["events"]
            report.llm_responses += stone["llm_calls"]
            report.approvals += stone["approvals"]
            report.pauses += stone["pauses"]
        if dry_run:
            return report
        with retention_deleting():
            Event.objects.filter(turn_id__in=ids).delete()
        Message.objects.filter(turn_id__in=ids).delete()
        SkillApproval.objects.filter(turn_id__in=ids).delete()
        TurnPause.objects.filter(turn_id__in=ids).delete()
        SkillExecution.objects.filter(dispatch__turn_id__in=ids).delete()
        LLMCall.objects.filter(turn_id__in=ids).update(response={})
        AgentDispatch.objects.filter(turn_id__in=ids).update(
            mission="", context="", result="", error="", close_reason="", transcript=[], contract={},
            awaiting={}, outside=[])
        for turn in turns:
            turn.tombstone, turn.pruned_at = tombstones[turn.pk], now
            turn.answer_draft, turn.error, turn.awaiting, turn.outside = "", "", {}, []
        Turn.objects.bulk_update(turns, ["tombstone", "pruned_at", "answer_draft", "error", "awaiting", "outside"])
        return report


# --- deletion -------------------------------------------------------------------------

@dataclass(frozen=True)
class DeletionSummary:
    """What deleting a conversation takes with it, for the confirm step."""

    turns: int
    messages: int
    events: int
    active_turn: Turn | None

    @property
    def refused(self) -> str:
        return ("A turn is still running or waiting for you in this conversation: stop it first, "
                "then delete the conversation.") if self.active_turn else ""


def conversation_deletion_summary(*, conversation: Conversation) -> DeletionSummary:
    return DeletionSummary(
        turns=conversation.turns.count(), messages=conversation.messages.count(), events=conversation.events.count(),
        active_turn=conversation.turns.filter(status__in=ACTIVE_TURN_STATUSES).first())


@transaction.atomic
def conversation_delete(*, conversation: Conversation, user) -> dict[str, int]:
    """The owner deletes a conversation and everything in it (turns, agents, calls,
    messages, events). Refused while a turn runs or waits for the owner: stop it first,
    so no worker is left acting on rows that are gone. Returns the rows removed by model."""
    conversation = Conversation.objects.select_for_update().filter(pk=conversation.pk).first()
    if conversation is None:
        raise DeletionRefused("This conversation was already deleted.")
    if conversation.owner_id != user.pk:
        raise DeletionRefused("Only the conversation's owner can delete it.")
    if refused := conversation_deletion_summary(conversation=conversation).refused:
        raise DeletionRefused(refused)
    conversation_id = conversation.pk
    with retention_deleting():
        _, removed = conversation.delete()
    # The trail is gone with it: the log keeps that it was deleted, by whom, and how much.
    logger.info("Conversation %s deleted by its owner %s: %s", conversation_id, user.pk, removed)
    return removed


def user_delete(*, user) -> dict[str, int]:
    """A superuser deletes a user and everything of theirs: conversations with all they
    hold, skill records (tasks, calendar, outbox, memories), rules, allow lists,
    preferences, and, once the deletion commits, their workspace directory.

    Their turns still running are not waited for: a worker that next touches one finds
    its rows gone and lets it go (a lost lease). Such a worker may hold its turn's row
    while it waits for one the deletion has locked (an event it inserts points at the
    conversation): no lock order serves every path of the engine, so PostgreSQL rolls
    one of the two back as a deadlock, and when that is the deletion it runs again, from
    its savepoint, once the worker's step has committed."""
    attempt = 1
    while True:
        try:
            with transaction.atomic():
                return _user_delete(user)
        except OperationalError as exc:
            if attempt == DELETION_ATTEMPTS or not rolled_back_by_server(exc):
                raise
            logger.info("Deleting user %s met a running turn (%s); trying again", user.pk, exc.__cause__)
            time.sleep(0.1 * attempt)
            attempt += 1


def _user_delete(user) -> dict[str, int]:
    workspace, user_id = workspace_root(user), user.pk
    with retention_deleting():
        _hold_still(user)
        _, removed = user.delete()
    # The login throttle (django-axes) keeps usernames as text, not as a key: its records
    # of this user's logins go too, or the name would outlive them.
    for model in (AccessAttempt, AccessFailureLog, AccessLog):
        model.objects.filter(username=user.get_username()).delete()
    logger.info("User %s deleted with everything of theirs: %s", user_id, removed)
    # After the commit only: a rollback must not leave a user whose files are gone.
    transaction.on_commit(partial(shutil.rmtree, workspace, ignore_errors=True))
    return removed


def _hold_still(user) -> None:
    """Lock the user's rows that others point at, before Django collects what to delete.
    A worker still running their turn writes rows (a message, an event, a model call)
    pointing at them, and PostgreSQL checks those foreign keys when the worker commits,
    with a key-share lock on the parent: a row committed before these locks are granted
    is collected with the rest, and one committing after waits for the deletion and then
    fails its check (the worker lets the turn go). Without them, a row committed between
    the collection and the DELETE broke the deletion with a foreign-key error. SQLite
    runs one writer at a time, so there it changes nothing."""
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    for rows in (Conversation.objects.filter(owner=user), Turn.objects.filter(conversation__owner=user),
                 AgentDispatch.objects.filter(turn__conversation__owner=user),
                 SkillExecution.objects.filter(dispatch__turn__conversation__owner=user)):
        list(rows.select_for_update(of=("self",)).order_by("pk").values_list("pk", flat=True))


def deletion_preview(callable_, *args, **kwargs):
    """Run Django's "what would be deleted" collector (the admin's confirmation page)
    as the deletion itself would see the event log: removable, not protected."""
    with retention_deleting():
        return callable_(*args, **kwargs)
