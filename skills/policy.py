"""Whether a call may run unasked: the owner's policy for its skill.

A policy is "allow", "ask" or "deny". The owner's rules (SkillRule) come first — a deny
before anything, then a rule scoped to the call's recipients' domain, then one for the
whole skill, the newest first, expired and revoked rules never — and the settings'
default for the skill after them (settings.ASSISTANT_SKILL_POLICIES; a skill that sends
asks, any other allows). The engine asks the owner for more than this (new recipients,
outside content): orchestration/questions/approvals.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from skills.base import Skill
from skills.models import Policy, SkillRule


DEFAULT_WORDS = {Policy.ALLOW: "runs unasked by default", Policy.ASK: "asks first by default",
                 Policy.DENY: "is refused by default"}


@dataclass(frozen=True)
class Verdict:
    policy: str  # a Policy
    words: str  # where it comes from, for the prompt and the audit
    rule_id: int | None = None


def default_policy(skill: Skill) -> str:
    table = settings.ASSISTANT_SKILL_POLICIES
    if skill.name in table:
        return table[skill.name]
    if skill.policy is not None:
        return skill.policy
    return Policy.ASK if skill.sends else Policy.ALLOW


def domain_of(address: str) -> str:
    return address.rpartition("@")[2].strip().lower()


def _applies(rule: SkillRule, recipients: list[str]) -> bool:
    if not rule.recipient_domain:
        return True
    return bool(recipients) and all(domain_of(r) == rule.recipient_domain for r in recipients)


def live_rules(user, skill: str | None = None):
    now = timezone.now()
    rules = SkillRule.objects.filter(owner=user, revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    return rules.filter(skill=skill) if skill else rules


def policy_for(user, skill: Skill, arguments: dict) -> Verdict:
    recipients = skill.recipients(arguments) if skill.sends else []
    rules = [rule for rule in live_rules(user, skill.name) if _applies(rule, recipients)]
    rules.sort(key=lambda r: (r.policy != Policy.DENY, not r.recipient_domain, -r.created_at.timestamp(), -r.pk))
    if rules:
        rule = rules[0]
        return Verdict(rule.policy, f"your rule: {rule.words()}", rule.pk)
    policy = default_policy(skill)
    return Verdict(policy, f"{skill.name} {DEFAULT_WORDS[policy]}")
