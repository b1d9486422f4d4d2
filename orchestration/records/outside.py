"""Outside content belongs to the conversation (orchestration/questions/approvals.py).

Once an agent has read text the owner did not write, the conversation's history carries
it: the answer quotes it, and the next request ("thanks, go ahead") builds on it. So
what a turn read is folded into its conversation when the turn ends, however it ends,
and every later turn starts with it (`Turn.outside`, which each dispatch of the turn
inherits): their side effects ask first, with the warning, and offer no rule.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from orchestration.models import Conversation, SkillExecution, Turn
from skills.provenance import merged


def turn_outside_read(turn: Turn) -> tuple[list[str], datetime | None]:
    """What outside content the turn read, and when it first read any: from its skill
    calls' rows (nested ones too), which are the committed truth whatever became of
    the agents that made them, and from what its orchestrator read (`Turn.outside`,
    which starts with the conversation's)."""
    rows = list(SkillExecution.objects.filter(dispatch__turn=turn).exclude(outside=[]).order_by("id")
                .values_list("outside", "finished_at"))
    return merged(turn.outside, *(outside for outside, _ in rows)), min((at for _, at in rows if at), default=None)


def conversation_outside_fold(*, turn: Turn) -> None:
    """Fold what `turn` read into its conversation, keeping when it first read any.
    Called in the transaction that ends the turn (every ending passes through
    turns._finish), so no ending forgets it; and no next turn starts before that
    commits (one active turn per conversation), so none starts without it."""
    conversation = turn.conversation
    read, first_read = turn_outside_read(turn)
    outside = merged(conversation.outside, read)
    if outside == conversation.outside:
        return
    since = conversation.outside_since or first_read or timezone.now()
    Conversation.objects.filter(pk=conversation.pk).update(outside=outside, outside_since=since)
    conversation.outside, conversation.outside_since = outside, since
