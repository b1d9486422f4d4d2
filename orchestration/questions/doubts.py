"""Calls in doubt: a call to another system was sent, and its answer was lost.

An MCP server's tool cannot join our transaction (skills/executor.py, Skill.external).
When a worker dies after such a call that changes something was sent and before its
result was stored, nobody knows whether it happened. The engine does not send it again
on its own: the turn pauses with the question (the approval path: stored, pushed live,
owner only, answered once), naming what was called, with which arguments, and when.
"Send it again" runs it once more; "Go on as if it failed" answers the agent that it may
or may not have happened, and the turn goes on. The answer is bound to that one send
(`doubt_digest`): if the call is lost again, the owner is asked again.
"""

from __future__ import annotations

import hashlib

from django.utils import formats, timezone

from orchestration.models import AgentDispatch, SkillApproval
from orchestration.questions.approvals import ApprovalNeeded, owner_word
from skills.base import Skill
from skills.executor import CallDenied, Doubt


def doubt_digest(row) -> str:
    """One send of one call: its row and the moment it was sent."""
    return hashlib.sha256(f"in-doubt:{row.pk}:{row.sent_at.isoformat()}".encode()).hexdigest()


def sent_words(row, zone: str = "") -> str:
    """When the call was sent, in the owner's zone (the turn's; blank: the site's)."""
    with timezone.override(zone or None):
        return formats.date_format(timezone.localtime(row.sent_at), "D j M Y, H:i:s")


class InDoubt(ApprovalNeeded):
    """The turn pauses to ask whether to send a lost call again."""

    def __init__(self, *, dispatch: AgentDispatch, skill: Skill, arguments: dict, row):
        sent = sent_words(row, dispatch.turn.time_zone)
        reason = (f"it was sent to {skill.domain} at {sent} and the worker stopped before its answer was stored: "
                  "nobody knows whether it happened")
        super().__init__(dispatch=dispatch, skill=skill.name, arguments=arguments, reasons=[reason], outside=[])
        self.detail |= {"digest": doubt_digest(row), "execution_id": row.pk, "sent_at": row.sent_at.isoformat(),
                        "in_doubt": True}
        self.message = f"{dispatch.agent_id}'s call of {skill.name} is in doubt: {reason}"

    def summary(self, label: str) -> str:
        return f"Call in doubt: {self.message}"

    def record(self, pause) -> None:
        SkillApproval.objects.create(
            turn=pause.turn, dispatch_id=self.detail["dispatch_id"], pause=pause, skill=self.detail["skill"],
            arguments=self.detail["arguments"], digest=self.detail["digest"], reasons=self.detail["reasons"],
            kind=SkillApproval.Kind.IN_DOUBT, execution_id=self.detail["execution_id"],
        )


def ask(*, dispatch: AgentDispatch) -> Doubt:
    """The executor's `doubt` for an agent's calls: the owner's answer to this send, or
    the question."""

    def doubt(skill: Skill, arguments: dict, row) -> None:
        answer = (SkillApproval.objects.filter(dispatch=dispatch, kind=SkillApproval.Kind.IN_DOUBT,
                                               digest=doubt_digest(row))
                  .exclude(decision=SkillApproval.Decision.PENDING).select_related("decided_by").first())
        if answer is None:
            raise InDoubt(dispatch=dispatch, skill=skill, arguments=arguments, row=row)
        if answer.decision == SkillApproval.Decision.DENIED:
            who = owner_word(answer) | {"answer": "go on as if it failed"}
            raise CallDenied(f"{skill.name} was sent at {sent_words(row, dispatch.turn.time_zone)} and its answer "
                             "was lost: it may or may not have happened. The owner chose to go on as if it failed; "
                             "do not call it again, and say in your report that it may have happened",
                             clearance=who)

    return doubt
