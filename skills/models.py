"""The skills app's tables.

`AbstractSkillExecution` is the contract between the execution wrapper and whoever
stores the audit rows: the engine's `orchestration.SkillExecution` (named by the
SKILLS_EXECUTION_MODEL setting, like AUTH_USER_MODEL) adds the link to its dispatch.
Skills stay ignorant of agents; the engine knows which dispatch made the call.

`result` holds the handler's JSON result when the call completed. A failed or timed-out
row keeps the details an agent was shown there instead: {"error_kind", "problems",
"retryable"} (see skills/executor.py), so a replay answers exactly as the first call did.

The domains' own records live in skills/domains/<domain>/models.py, imported below so
that Django registers them with this app.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from skills.domains.calendar.models import CalendarEvent
from skills.domains.email.models import OutboxEmail
from skills.domains.memory.models import Memory
from skills.domains.tasks.models import Task
from skills.mcp.models import McpServer

__all__ = [
    "AbstractSkillExecution",
    "CalendarEvent",
    "ExecutionStatus",
    "Memory",
    "EgressAllow",
    "McpServer",
    "OutboxEmail",
    "Policy",
    "SkillCircuit",
    "SkillRule",
    "Task",
]


class ExecutionStatus(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"


class AbstractSkillExecution(models.Model):
    skill = models.CharField(max_length=100, db_index=True)
    arguments = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.RUNNING
    )
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    tool_call_id = models.CharField(max_length=128)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    started_at = models.DateTimeField(default=timezone.now)  # a call run ahead sets its own (skills/executor.py)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    # A side effect's clearance: by whose word it ran ({"by": "policy" | "rule" | "owner",
    # ...}) and the outside content that had reached the caller (orchestration/questions/approvals.py).
    clearance = models.JSONField(default=dict, blank=True)
    # The outside content in its result (Skill.outside), as the engine tracked it.
    outside = models.JSONField(default=list, blank=True)
    # When a call whose effect is outside our database was sent (Skill.external): a row
    # still running with this set lost its answer, and the call is in doubt.
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.skill} [{self.status}]"


class SkillCircuit(models.Model):
    """A circuit breaker's state: consecutive failures and, when open, until when.

    One row per skill and user (that user's own circuit) and one per skill without a
    user (the skill's circuit for everyone); skills/breaker.py says which failures reach
    which. Kept in the database rather than process memory so that every worker process
    sees the same state.
    """

    skill = models.CharField(max_length=100)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="skill_circuits", help_text="Empty: the skill's circuit for every user.",
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["skill", "owner_id"]
        constraints = [
            # Two conditional constraints: NULLs are distinct in a plain unique one.
            models.UniqueConstraint(
                fields=["skill"], condition=models.Q(owner__isnull=True), name="skill_circuit_everyone"
            ),
            models.UniqueConstraint(
                fields=["skill", "owner"], condition=models.Q(owner__isnull=False), name="skill_circuit_owner"
            ),
        ]

    def __str__(self) -> str:
        whose = f"user {self.owner_id}" if self.owner_id else "everyone"
        return f"{self.skill} for {whose} ({self.consecutive_failures} failures)"


class Policy(models.TextChoices):
    ALLOW = "allow", "allow"
    ASK = "ask", "ask first"
    DENY = "deny", "deny"


class SkillRule(models.Model):
    """An owner's standing answer for one skill: allow, ask or deny. It may hold only for
    messages whose every recipient is at `recipient_domain`, and only until `expires_at`
    ("always allow email to my own domain, 30 days"). See skills/policy.py."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="skill_rules")
    skill = models.CharField(max_length=100)
    policy = models.CharField(max_length=8, choices=Policy.choices)
    recipient_domain = models.CharField(max_length=253, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["owner_id", "skill", "-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "skill"], name="skill_rule_owner_skill")]

    def __str__(self) -> str:
        return self.words()

    def words(self) -> str:
        scope = f" to addresses at {self.recipient_domain}" if self.recipient_domain else ""
        until = f" until {self.expires_at:%Y-%m-%d %H:%M}" if self.expires_at else ""
        return f"{self.get_policy_display()} {self.skill}{scope}{until}"


class EgressAllow(models.Model):
    """An address or a whole domain the owner lets messages go to without asking."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="egress_allowed")
    entry = models.CharField(max_length=254)  # "bob@example.com" or "example.com", lower case
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner_id", "entry"]
        constraints = [models.UniqueConstraint(fields=["owner", "entry"], name="egress_allow_unique")]

    def __str__(self) -> str:
        return self.entry
