"""Approvals: no irreversible act without the owner's policy or the owner's word.

Every valid, granted call of a skill that is not read-only passes `gate` in the
transaction that opens its row (skills/executor.py, `clear`), before its handler runs.
It runs unasked only when nothing below asks:

- the owner's policy for the skill (skills/policy.py) is "ask" — or "deny": refused;
- a message would go to an address not familiar to the owner (skills/egress.py);
- outside content has reached the caller: text the user did not write (a file, an email
  body, a memory, task or event an agent saved) in the agent's own results, its
  dependencies' or children's reports, what its parent had seen or the orchestrator had
  read when it was dispatched, or an earlier turn of its conversation
  (orchestration/records/outside.py). Whatever the policy: that text may carry instructions the
  model followed.

Otherwise the turn pauses with a SkillApproval holding the exact call (ApprovalNeeded,
taking the continue? path: stored, pushed live, owner only, answered once). Approve lets
that one call run, deny answers it as refused (the agent reads why and goes on); either
resumes the turn, and the agent's replay reaches the same call again. The approval is
used in the transaction that opens the call's row, so it runs exactly one call, however
the worker dies around it. A denial answers every identical call of that agent.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orchestration.budgets.limits import LimitTripped
from orchestration.lifecycle import dispatches as lifecycle
from orchestration.lifecycle.refusals import TurnRefused
from orchestration.models import AgentDispatch, SkillApproval, Turn, TurnPause, TurnStatus
from orchestration.questions.pauses import APPROVAL, AlreadyAnswered, turn_resume
from orchestration.records.catalogue import APPROVAL_DECIDED
from orchestration.records.events import event_record
from skills import egress
from skills.base import Skill
from skills.executor import CallDenied, Clear
from skills.models import Policy, SkillRule
from skills.policy import domain_of, policy_for


class ApprovalNeeded(LimitTripped):
    """A call waits for the owner's word: the turn pauses with the call (turn_pause)."""

    def __init__(self, *, dispatch: AgentDispatch, skill: str, arguments: dict, reasons: list[str],
                 outside: list[str]):
        detail = {"agent": dispatch.agent_id, "dispatch_id": dispatch.pk, "skill": skill, "arguments": arguments,
                  "digest": call_digest(skill, arguments), "reasons": reasons, "outside": outside}
        super().__init__(APPROVAL, f"{dispatch.agent_id} asks to run {skill}: {'; '.join(reasons)}", detail=detail)

    def summary(self, label: str) -> str:
        return f"Approval asked: {self.message}"

    def record(self, pause: TurnPause) -> None:
        """The question: the call as the agent made it, why it asks, what reached it."""
        SkillApproval.objects.create(
            turn=pause.turn, dispatch_id=self.detail["dispatch_id"], pause=pause, skill=self.detail["skill"],
            arguments=self.detail["arguments"], digest=self.detail["digest"], reasons=self.detail["reasons"],
            outside=self.detail["outside"],
        )


def call_digest(skill: str, arguments: object) -> str:
    text = json.dumps([skill, arguments], sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def gate(*, dispatch: AgentDispatch, user, outside: list[str]) -> Clear:
    """The executor's `clear` for an agent's calls; `outside` is what had reached the
    agent when the model wrote them."""

    def clear(skill: Skill, arguments: dict, row) -> dict:
        if skill.read_only:
            return {}
        verdict = policy_for(user, skill, arguments)
        cleared = {"policy": verdict.policy, "policy_words": verdict.words, "rule_id": verdict.rule_id,
                   "outside": list(outside)}
        if verdict.policy == Policy.DENY:
            raise CallDenied(f"the owner does not allow {skill.name} ({verdict.words})",
                             clearance=cleared | {"by": "rule" if verdict.rule_id else "policy"})
        reasons = []
        if verdict.policy == Policy.ASK:
            reasons.append(verdict.words)
        if skill.sends and (new := egress.unfamiliar(user, skill.recipients(arguments))):
            reasons.append(f"first message to {', '.join(new)} (not your domain, a contact or on your allow list)")
        if outside:
            reasons.append(f"outside content reached this call: {'; '.join(outside[:5])}"
                           + (f" and {len(outside) - 5} more" if len(outside) > 5 else ""))
        if not reasons:
            return cleared | {"by": "rule" if verdict.rule_id else "policy"}
        answer = _answer_for(dispatch, skill.name, arguments)
        if answer is None:
            raise ApprovalNeeded(dispatch=dispatch, skill=skill.name, arguments=arguments, reasons=reasons,
                                 outside=list(outside))
        who = owner_word(answer) | {"reasons": answer.reasons}
        if answer.decision == SkillApproval.Decision.DENIED:
            raise CallDenied(f"the owner declined this call of {skill.name}; do not try it again, "
                             f"report that it was declined", clearance=cleared | who)
        SkillApproval.objects.filter(pk=answer.pk).update(execution_id=row.pk)
        return cleared | who

    return clear


def owner_word(answer: SkillApproval) -> dict:
    """A call's clearance by the owner's answer: who answered which question, and when."""
    return {"by": "owner", "approval_id": answer.pk,
            "decided_by": answer.decided_by.get_username() if answer.decided_by else "",
            "decided_at": answer.decided_at.isoformat() if answer.decided_at else ""}


def _answer_for(dispatch: AgentDispatch, skill: str, arguments: dict) -> SkillApproval | None:
    """The owner's unused answer to this very call (a denial stays usable)."""
    answers = SkillApproval.objects.filter(dispatch=dispatch, digest=call_digest(skill, arguments),
                                           kind=SkillApproval.Kind.APPROVAL).exclude(
        decision=SkillApproval.Decision.PENDING).select_related("decided_by").order_by("id")
    for answer in answers:
        if answer.decision == SkillApproval.Decision.DENIED or answer.execution_id is None:
            return answer
    return None


class StaleAnswer(AlreadyAnswered):
    """An answer to a question that is not the one waiting: answered already, another
    turn's, or a call other than the one the owner was shown. It is applied to nothing;
    `waiting` is the approval the turn waits on now (None: no approval waits)."""

    def __init__(self, message: str, *, waiting: SkillApproval | None):
        super().__init__(message)
        self.waiting = waiting


def approval_answer(*, turn: Turn, user, approval_id: int, digest: str | None, approve: bool,
                    always: bool = False) -> SkillApproval:
    """The owner's answer to approval `approval_id` of `turn`: approve (once, or with
    `always` a rule allowing the skill for ASSISTANT_APPROVAL_RULE_DAYS, to these
    recipients' domain for a message) or deny; the turn resumes either way. Only the
    owner; once.

    The answer names the question it answers, and `digest` the call that was shown
    (`call_digest`; None only from the terminal, which names a stored call by its id):
    a second click, or a tab still showing an answered question, posts an answer that
    is no longer the waiting one, and must not land on the call asked next (StaleAnswer).
    """
    with transaction.atomic():
        turn = lifecycle.lock_turn(turn.pk)
        if turn.conversation.owner_id != user.pk:
            raise TurnRefused("Only the conversation's owner can answer this.")
        approval = _waiting(turn)
        _refuse_stale(approval, approval_id=approval_id, digest=digest)
        pause = approval.pause
        rule = _rule_for(approval, user) if approve and always and rule_offered(approval) else None
        decision = SkillApproval.Decision.APPROVED if approve else SkillApproval.Decision.DENIED
        approval.decision, approval.decided_by, approval.decided_at, approval.rule = decision, user, timezone.now(), rule
        approval.save(update_fields=["decision", "decided_by", "decided_at", "rule"])
        agent = pause.detail.get("agent", "")
        event_record(
            type=APPROVAL_DECIDED, turn=turn,
            summary=(f"{user.get_username()} chose to {approval.decision_words()} ({approval.skill} for {agent}, "
                     "in doubt)" if approval.in_doubt else
                     f"{user.get_username()} {decision} {approval.skill} for {agent}")
            + (f" and set a rule: {rule.words()}" if rule else ""),
            payload={"approval_id": approval.pk, "skill": approval.skill, "decision": decision,
                     "decided_by": user.get_username(), "rule": rule.words() if rule else "",
                     "reasons": approval.reasons, "outside": approval.outside},
        )
        turn_resume(turn=turn, pause=pause, user=user)
    return approval


def _waiting(turn: Turn) -> SkillApproval | None:
    """The approval `turn` waits on, locked; the caller holds the turn's lock."""
    if turn.status != TurnStatus.PAUSED:
        return None
    return (SkillApproval.objects.select_for_update(of=("self",)).select_related("pause", "dispatch")
            .filter(pause__turn=turn, pause__decision="", pause__limit=APPROVAL).first())


def _refuse_stale(waiting: SkillApproval | None, *, approval_id: int, digest: str | None) -> None:
    """Refuse an answer that is not to `waiting`, the question open now, or not to the
    call it holds."""
    if waiting is None:
        raise StaleAnswer(f"Approval {approval_id} was answered already: nothing was done with this answer, "
                          "and no approval is waiting now.", waiting=None)
    if waiting.pk != approval_id:
        raise StaleAnswer(f"Approval {approval_id} was answered already: nothing was done with this answer. "
                          f"The question waiting now is approval {waiting.pk} "
                          f"({waiting.dispatch.agent_id} asks to run {waiting.skill}).", waiting=waiting)
    if digest is not None and digest != waiting.digest:
        raise StaleAnswer(f"The call answered is not the call approval {approval_id} asks about: nothing was done "
                          "with this answer.", waiting=waiting)


def _domains(approval: SkillApproval) -> set[str]:
    return {domain_of(address) for address in (approval.arguments or {}).get("to", []) if isinstance(address, str)}


def rule_offered(approval: SkillApproval) -> str:
    """The "always allow" rule the prompt offers, in words; "" when none is (a message to
    several domains is approved once: a rule for all of them would be too wide; nor is
    one offered for a call outside content reached, whose recipients it may have chosen,
    nor for a call in doubt: its question is about one lost call)."""
    if approval.outside or approval.in_doubt:
        return ""
    domains = _domains(approval)
    if "to" in (approval.arguments or {}) and len(domains) != 1:
        return ""
    scope = f" to addresses at {next(iter(domains))}" if domains else ""
    return f"Always allow {approval.skill}{scope} for {settings.ASSISTANT_APPROVAL_RULE_DAYS} days"


def _rule_for(approval: SkillApproval, user) -> SkillRule:
    domains = _domains(approval)
    return SkillRule.objects.create(
        owner=user, skill=approval.skill, policy=Policy.ALLOW, recipient_domain=domains.pop() if domains else "",
        expires_at=timezone.now() + timedelta(days=settings.ASSISTANT_APPROVAL_RULE_DAYS),
    )


def clearance_words(clearance: dict, *, with_outside: bool = True) -> str:
    """By whose word a side effect ran, for the audit: "approved by alice at …".
    `with_outside=False` leaves out the outside content that had reached it, for a page
    that marks that on its own line."""
    if not clearance:
        return ""
    if clearance.get("by") == "owner":
        words = f"the owner's word: {clearance.get('decided_by') or 'the owner'}"
        if clearance.get("decided_at"):
            at = timezone.localtime(datetime.fromisoformat(clearance["decided_at"]))
            words += f" at {at:%Y-%m-%d %H:%M:%S}"
        if clearance.get("reasons"):
            words += f" (asked because: {'; '.join(clearance['reasons'])})"
    else:
        words = clearance.get("policy_words") or clearance.get("by", "")
    if with_outside and clearance.get("outside"):
        words += f"; outside content had reached it: {'; '.join(clearance['outside'])}"
    return words


def approval_question(approval: SkillApproval) -> str:
    """The approval prompt as text (manage.py ask prints it), naming the approval by its
    id: the terminal answers with it (`--approve ID`), as the page posts it."""
    arguments = approval.arguments or {}
    if approval.in_doubt:
        lines = [f"**Send it again?** (approval {approval.pk}) {approval.dispatch.agent_id}'s call of "
                 f"{approval.skill} may or may not have happened. Approve sends it again; deny goes on as if it "
                 "failed."]
    else:
        lines = [f"**Approve?** (approval {approval.pk}) {approval.dispatch.agent_id} wants to run "
                 f"{approval.skill}. Nothing has been done yet."]
    lines += [f"- {key}: {value if not isinstance(value, list) else ', '.join(map(str, value))}"
              for key, value in arguments.items()]
    lines += ["It asks because:"] + [f"- {reason}" for reason in approval.reasons]
    return "\n".join(lines)
