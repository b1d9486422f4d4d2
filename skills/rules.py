"""The owner's rules (SkillRule) as they manage them on the Approvals page: made, revoked
and listed beside each skill's default. skills/policy.py reads them for every call.

A rule is never deleted, only revoked: a call it allowed keeps its id in the clearance
(orchestration/questions/approvals.py), and the audit must still be able to say what it was.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone

from skills import registry
from skills.base import Skill
from skills.egress import plain_domain
from skills.models import Policy, SkillRule
from skills.policy import default_policy, live_rules

MAX_RULE_DAYS = 365  # a longer rule is one the owner has forgotten
HISTORY_SHOWN = 50  # ended rules listed on the page; "always allow" makes one a month


def ruled_skill(name: str, owner=None) -> Skill:
    """The skill a rule of `owner`'s may name: one of theirs (their MCP servers' tools
    too) that is not read-only (those never ask)."""
    try:
        skill = registry.get_skill(name, owner)
    except registry.UnknownSkill as exc:
        raise ValidationError(str(exc)) from None
    if skill.read_only:
        raise ValidationError(f"{name} only reads: it runs without asking, whatever a rule says.")
    return skill


def skill_rule_create(*, owner, skill: str, policy: str, recipient_domain: str = "",
                      days: int | None = None) -> SkillRule:
    """The owner's rule for `skill`, from now; `days` None: until revoked. A recipient
    domain scopes it to messages whose every recipient is there, so only a skill that
    sends takes one."""
    ruled = ruled_skill(skill, owner)
    if policy not in Policy.values:
        raise ValidationError(f"A policy is one of {', '.join(Policy.values)}.")
    domain = plain_domain(recipient_domain) if recipient_domain else ""
    if domain and not ruled.sends:
        raise ValidationError(f"{skill} sends nothing: a recipient domain would never apply.")
    if days is not None and not 1 <= days <= MAX_RULE_DAYS:
        raise ValidationError(f"A rule lasts from 1 to {MAX_RULE_DAYS} days, or until you revoke it.")
    expires_at = timezone.now() + timedelta(days=days) if days else None
    return SkillRule.objects.create(owner=owner, skill=ruled.name, policy=policy, recipient_domain=domain,
                                    expires_at=expires_at)


def skill_rule_revoke(*, rule: SkillRule) -> bool:
    """Revoke a live rule; False when it was revoked already (a second click, another tab)."""
    now = timezone.now()
    revoked = SkillRule.objects.filter(pk=rule.pk, revoked_at__isnull=True).update(revoked_at=now)
    if revoked:
        rule.revoked_at = now
    return bool(revoked)


def ended_rules(owner):
    """The rules that no longer apply, revoked or expired, the newest first."""
    return SkillRule.objects.filter(owner=owner).filter(
        Q(revoked_at__isnull=False) | Q(expires_at__lte=timezone.now())).order_by("-created_at", "-id")


def policy_overview(owner) -> dict:
    """Every skill of the owner's that is not read-only (their MCP servers' tools too),
    with its default in words and the owner's live rules for it; the live rules again,
    newest first, and the ended ones as history."""
    live = list(live_rules(owner).order_by("-created_at", "-id"))
    skills = [
        {"skill": skill, "default": Policy(default_policy(skill)).label,
         "rules": [rule for rule in live if rule.skill == skill.name]}
        for skill in registry.all_skills(owner)
        if not skill.read_only
    ]
    return {"skills": skills, "live_rules": live, "ended_rules": list(ended_rules(owner)[:HISTORY_SHOWN])}
