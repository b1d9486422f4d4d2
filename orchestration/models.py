"""The engine's state. The database is the source of truth (DESIGN.md §4).

Conversation → Turn → AgentDispatch → SkillExecution, with Messages for the
orchestrator's history, LLMCalls for every model response (reused on replay) and an
append-only Event log for the timeline and the audit trail.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import formats, timezone

from skills.models import AbstractSkillExecution


class Conversation(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Outside content (text the owner did not write) that any agent of the conversation
    # has read, and since when: the history carries it into every later turn, whose side
    # effects therefore ask first (orchestration/questions/approvals.py).
    outside = models.JSONField(default=list, blank=True)
    outside_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="conv_owner_recent")]

    def __str__(self) -> str:
        if self.title:
            return self.title
        if self.created_at is None:  # not saved yet
            return "New conversation"
        # Told apart by when it was opened, in the reader's time zone, until its first request names it.
        return f"New conversation · {formats.date_format(timezone.localtime(self.created_at), 'M j, H:i')}"

    def get_absolute_url(self) -> str:
        return reverse("conversation_detail", args=[self.pk])


class TurnStatus(models.TextChoices):
    RUNNING = "running"
    WAITING = "waiting"  # the orchestrator waits for agents; no worker is held
    PAUSED = "paused"  # a limit tripped; the owner decides: continue or stop
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"


# A turn at work: its orchestrator runs or waits for its agents (the engine goes on with it).
WORKING_TURN_STATUSES = (TurnStatus.RUNNING, TurnStatus.WAITING)
# Not ended yet: at work, or paused for its owner.
ACTIVE_TURN_STATUSES = (*WORKING_TURN_STATUSES, TurnStatus.PAUSED)


class Turn(models.Model):
    """One user message and everything the engine did to answer it."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    number = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=TurnStatus.choices, default=TurnStatus.RUNNING, db_index=True
    )
    # The limits in force for this turn (a snapshot of settings, raised by Continue).
    limits = models.JSONField(default=dict, blank=True)
    # Counters, updated atomically with F() so concurrent workers never overshoot.
    agents_dispatched = models.PositiveIntegerField(default=0)
    skill_calls = models.PositiveIntegerField(default=0)
    llm_iterations = models.PositiveIntegerField(default=0)
    agent_llm_calls = models.PositiveIntegerField(default=0)  # sub-agents' model calls, nested ones too
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    continuations = models.PositiveIntegerField(default=0)
    # The conversation's skill calls in its sliding window when this turn started: with
    # this turn's own, a bound on the window that only ages down (orchestration/budgets/budget.py).
    prior_window_calls = models.PositiveIntegerField(default=0)
    # What the waiting orchestrator step is waiting for: {"tool_call_id", "agent_ids"}.
    awaiting = models.JSONField(default=dict, blank=True)
    # The orchestrator's lease (crash safety).
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # When its step was last handed to the broker and not yet claimed (see the reaper).
    queued_at = models.DateTimeField(null=True, blank=True)
    # How often the orchestrator's worker died holding it (an expired lease), for
    # dead-lettering; pauses, waits, Continues and hand-backs count nothing.
    crashes = models.PositiveIntegerField(default=0)
    llm_retries = models.PositiveIntegerField(default=0)  # transient-failure retries used
    error = models.TextField(blank=True)
    # The owner's time zone when the turn started: every skill reads dates in it, and the
    # prompts give the local date and time of the request in it (fixed for the turn, so
    # the prompts stay a cacheable prefix).
    time_zone = models.CharField(max_length=64, blank=True)
    # The final answer as far as the model has streamed it (the page shows it while the
    # turn runs, a reload too); the stored answer is the complete message.
    answer_draft = models.TextField(blank=True)
    # The outside content the orchestrator has read: its conversation's when the turn
    # started (orchestration/records/outside.py), then its agents' reports. Every agent it
    # dispatches afterwards carries it (AgentDispatch.outside).
    outside = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A fork (orchestration/replay/forking.py): the stored turn whose answers it reused up
    # to `forked_at` ("orchestrator:2", "finder:1"), where it took an edited answer.
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks")
    forked_at = models.CharField(max_length=80, blank=True)
    # Retention (orchestration/reports/retention.py): when `manage.py prune` removed the turn's
    # transcript, and what it held (counts, tokens, cost, dates). Its LLM calls stay, with
    # their tokens and cost but not their responses, so every usage figure stays right.
    pruned_at = models.DateTimeField(null=True, blank=True)
    tombstone = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["conversation_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "number"], name="turn_number_unique"),
            models.UniqueConstraint(
                fields=["conversation"],
                condition=Q(status__in=ACTIVE_TURN_STATUSES),
                name="one_active_turn_per_conversation",
            ),
        ]
        indexes = [models.Index(fields=["status", "lease_expires_at"], name="turn_lease")]

    def __str__(self) -> str:
        return f"Turn {self.number} of {self.conversation}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_TURN_STATUSES

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TurnPause(models.Model):
    """A tripped turn- or conversation-level limit: the stored "continue?" question."""

    class Decision(models.TextChoices):
        PENDING = "", "pending"
        CONTINUE = "continue"
        STOP = "stop"

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="pauses")
    limit = models.CharField(max_length=64)
    detail = models.JSONField(default=dict, blank=True)  # completed, not started, budget left
    tripped_at = models.DateTimeField(auto_now_add=True)
    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["turn_id", "tripped_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["turn"], condition=Q(decision=""), name="one_open_pause_per_turn"
            )
        ]

    def __str__(self) -> str:
        return f"{self.limit} on {self.turn}"


class SkillApproval(models.Model):
    """The owner's answer to one side-effecting call the engine would not run unasked:
    the call as the agent made it, why it asked, and the decision, used once.

    Asked with the turn's pause (one open question per turn), answered once by the
    owner; the call it approves is keyed by (dispatch, digest of skill and arguments),
    and `execution_id` is set, in the transaction that opens that call's row, when it is
    used — so an approval runs exactly one call, even across a crash and a replay."""

    class Decision(models.TextChoices):
        PENDING = "", "pending"
        APPROVED = "approved"
        DENIED = "denied"

    class Kind(models.TextChoices):
        APPROVAL = "approval", "run this call?"
        # A call to another system sent and never answered (orchestration/questions/doubts.py):
        # approve sends it again, deny goes on as if it failed.
        IN_DOUBT = "in_doubt", "the call is in doubt: send it again?"

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.APPROVAL)
    dispatch = models.ForeignKey("AgentDispatch", on_delete=models.CASCADE, related_name="approvals")
    pause = models.OneToOneField(TurnPause, null=True, blank=True, on_delete=models.SET_NULL, related_name="approval")
    skill = models.CharField(max_length=100)
    arguments = models.JSONField(default=dict, blank=True)
    digest = models.CharField(max_length=64)
    reasons = models.JSONField(default=list, blank=True)  # why it asked, one sentence each
    outside = models.JSONField(default=list, blank=True)  # the outside content that reached the call
    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    decided_at = models.DateTimeField(null=True, blank=True)
    rule = models.ForeignKey("skills.SkillRule", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="approvals")  # made with the approval ("always allow …")
    execution_id = models.PositiveIntegerField(null=True, blank=True)  # the call it was used by
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["turn_id", "id"]
        indexes = [models.Index(fields=["dispatch", "digest"], name="approval_call")]

    def __str__(self) -> str:
        return f"{self.skill} ({self.get_decision_display()})"

    @property
    def in_doubt(self) -> bool:
        return self.kind == self.Kind.IN_DOUBT

    def decision_words(self) -> str:
        """The answer in the owner's terms: "approved", "denied", or for a call in doubt
        "send it again", "go on as if it failed"."""
        if self.in_doubt:
            return {self.Decision.APPROVED: "send it again", self.Decision.DENIED: "go on as if it failed"}.get(
                self.decision, "")
        return self.decision


class Message(models.Model):
    """The orchestrator's conversation history (sub-agent traces live on dispatches)."""

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"
        NOTE = "note", "engine note"  # the engine correcting the model; not shown in chat
        NOTICE = "notice", "assistant"  # the engine telling the user; not sent to the model

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    turn = models.ForeignKey(
        Turn, null=True, blank=True, on_delete=models.CASCADE, related_name="messages"
    )
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="message_seq_unique"),
            # One answer per tool call: a replayed step cannot append a second result.
            models.UniqueConstraint(
                fields=["turn", "tool_call_id"],
                condition=~Q(tool_call_id=""),
                name="message_tool_result_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}"


class AgentProfile(models.Model):
    """An editable role (researcher, planner, ...) a dispatch can name."""

    name = models.SlugField(max_length=50, unique=True)
    description = models.CharField(max_length=300, blank=True)
    system_prompt = models.TextField()
    allowed_skills = models.JSONField(
        default=list, blank=True, help_text="Skill names this role may be granted."
    )
    read_only = models.BooleanField(
        default=False, help_text="Only read-only skills may be granted to this role."
    )
    max_tool_calls = models.PositiveIntegerField(default=5)
    model = models.CharField(max_length=100, blank=True, help_text="Blank: the agents' default.")
    may_delegate = models.BooleanField(default=False)
    version = models.PositiveIntegerField(default=1, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        # Every edit is a new version, so a dispatch records exactly what was in force.
        if not self._state.adding:
            self.version += 1
        super().save(*args, **kwargs)


class DispatchState(models.TextChoices):
    CREATED = "created"
    RUNNING = "running"
    WAITING = "waiting"  # for its own agents (a delegating agent); no worker held
    WAITING_FOR_MERGE = "waiting_for_merge"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    CLOSED = "closed"


class DispatchOutcome(models.TextChoices):
    NONE = "", "-"
    COMPLETED = "completed"
    BUDGET_EXCEEDED = "budget_exceeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class AgentDispatch(models.Model):
    """One sub-agent: its mission, grant, contract, lifecycle, lease and result."""

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="dispatches")
    agent_id = models.CharField(max_length=64)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    depth = models.PositiveSmallIntegerField(default=1)
    profile = models.ForeignKey(
        AgentProfile, null=True, blank=True, on_delete=models.SET_NULL, related_name="dispatches"
    )
    profile_name = models.CharField(max_length=50, blank=True)
    profile_version = models.PositiveIntegerField(null=True, blank=True)
    model = models.CharField(max_length=100, blank=True)
    mission = models.TextField()
    skills = models.JSONField(default=list, blank=True)
    context = models.TextField(blank=True)
    depends_on = models.JSONField(default=list, blank=True)
    max_tool_calls = models.PositiveIntegerField(default=5)
    contract = models.JSONField(default=dict, blank=True)
    tool_call_id = models.CharField(max_length=128, blank=True)  # the dispatch_agent call
    state = models.CharField(
        max_length=24, choices=DispatchState.choices, default=DispatchState.CREATED
    )
    outcome = models.CharField(
        max_length=24, choices=DispatchOutcome.choices, blank=True, default=""
    )
    close_reason = models.CharField(max_length=300, blank=True)
    result = models.TextField(blank=True)
    error = models.TextField(blank=True)
    transcript = models.JSONField(default=list, blank=True)
    tool_calls_used = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    crashes = models.PositiveIntegerField(default=0)  # workers that died holding it (expired leases)
    retries = models.PositiveIntegerField(default=0)  # transient-failure retries used
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When its task was last handed to the broker and not yet claimed (see the reaper).
    queued_at = models.DateTimeField(null=True, blank=True)
    # A delegating agent `waiting` until its own agents finish (no worker held):
    # {"tool_call_id", "agent_ids"} of the get_agent_results call it is waiting on.
    awaiting = models.JSONField(default=dict, blank=True)
    # Outside content (orchestration/questions/approvals.py): while it runs, what reached it from
    # outside its run (the orchestrator's or parent's reading when it was dispatched); once
    # it has finished, everything that reached it (its results, dependencies' and
    # children's reports too), which marks its report as data for whoever reads it.
    outside = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # The wall-clock limit: first start + the agent timeout, moved on by the time the turn
    # spent paused for its owner (a Continue does not hand over an agent already late).
    deadline_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)


    class Meta:
        ordering = ["turn_id", "id"]
        verbose_name = "agent dispatch"
        verbose_name_plural = "agent dispatches"
        constraints = [
            models.UniqueConstraint(fields=["turn", "agent_id"], name="dispatch_agent_id_unique")
        ]
        indexes = [
            models.Index(fields=["turn", "state"], name="dispatch_turn_state"),
            models.Index(fields=["state", "lease_expires_at"], name="dispatch_lease"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} ({self.state})"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class SkillExecution(AbstractSkillExecution):
    """One skill call made by a dispatch; (dispatch, tool_call_id) is the idempotency key."""

    dispatch = models.ForeignKey(
        AgentDispatch, on_delete=models.CASCADE, related_name="skill_executions"
    )

    class Meta:
        ordering = ["dispatch_id", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["dispatch", "tool_call_id"], name="skill_execution_idempotency_key"
            )
        ]
        indexes = [
            models.Index(fields=["started_at"], name="skill_exec_started"),
            models.Index(fields=["status", "started_at"], name="skill_exec_status"),
        ]


class LLMCall(models.Model):
    """One model response, stored before its tools run so a replay reuses it."""

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="llm_calls")
    dispatch = models.ForeignKey(
        AgentDispatch, null=True, blank=True, on_delete=models.CASCADE, related_name="llm_call_set"
    )
    key = models.CharField(max_length=120)
    model = models.CharField(max_length=100, blank=True)
    response = models.JSONField(default=dict)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    # In US dollars, from the price table (settings.ASSISTANT_MODEL_PRICES); null when
    # the model has no price there (the offline planner, an unlisted model).
    cost_usd = models.DecimalField(max_digits=16, decimal_places=10, null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["turn_id", "id"]
        verbose_name = "LLM call"
        constraints = [models.UniqueConstraint(fields=["turn", "key"], name="llm_call_key_unique")]

    def __str__(self) -> str:
        return self.key


class AppendOnlyError(Exception):
    """Events are facts: they are never changed, and removed only with what they describe."""


# Set only by orchestration/reports/retention.py around its deletions (prune, an owner deleting a
# conversation, a superuser deleting a user): anywhere else an event cannot be removed,
# and neither can the conversation, turn or dispatch it names.
_retention_deleting: ContextVar[bool] = ContextVar("retention_deleting", default=False)


@contextmanager
def retention_deleting():
    """Let the retention services remove events (and their rows) inside this block."""
    token = _retention_deleting.set(True)
    try:
        yield
    finally:
        _retention_deleting.reset(token)


def _refuse_delete_outside_retention() -> None:
    if not _retention_deleting.get():
        raise AppendOnlyError("Events are append-only; they are removed only by retention "
                              "(manage.py prune, deleting a conversation or a user).")


def protect_unless_retention(collector, field, sub_objs, using):
    """on_delete for the event log's links: PROTECT, except inside `retention_deleting()`,
    where Django's collector removes the events with the row they name (CASCADE)."""
    if _retention_deleting.get():
        models.CASCADE(collector, field, sub_objs, using)
    else:
        models.PROTECT(collector, field, sub_objs, using)


class EventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnlyError("Events are append-only; they cannot be updated.")

    def delete(self):
        _refuse_delete_outside_retention()
        return super().delete()

    def for_timeline(self):
        """With the turn and the agent a timeline row names, not their big JSON columns."""
        return self.select_related("dispatch", "turn").defer(
            "dispatch__transcript", "dispatch__contract", "dispatch__result", "turn__limits", "turn__awaiting")


class Event(models.Model):
    """One fact of the timeline (DESIGN.md §4). Rows are inserted, never changed; they
    leave only through orchestration/reports/retention.py."""

    conversation = models.ForeignKey(
        Conversation, on_delete=protect_unless_retention, related_name="events"
    )
    turn = models.ForeignKey(
        Turn, null=True, blank=True, on_delete=protect_unless_retention, related_name="events"
    )
    dispatch = models.ForeignKey(
        AgentDispatch, null=True, blank=True, on_delete=protect_unless_retention, related_name="events"
    )
    type = models.CharField(max_length=64, db_index=True)
    summary = models.CharField(max_length=300)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["conversation", "id"], name="event_replay"),
            models.Index(fields=["conversation", "type", "created_at"], name="event_window"),
            models.Index(fields=["turn", "id"], name="event_turn"),
            models.Index(fields=["dispatch", "id"], name="event_dispatch"),
        ]

    def __str__(self) -> str:
        return f"{self.type}: {self.summary}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError("Events are append-only; they cannot be updated.")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        _refuse_delete_outside_retention()
        return super().delete(*args, **kwargs)


class SpendAllowance(models.Model):
    """A user's own spending allowance, set by staff in the admin; a blank field takes
    the site's default (settings.ASSISTANT_SPEND), 0 means no cap for this user."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="spend_allowance")
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Prompt + completion tokens per day. Blank: the site default; 0: no cap.")
    tokens_per_month = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Per calendar month. Blank: the site default; 0: no cap.")
    usd_per_day = models.DecimalField(
        max_digits=12, decimal_places=4, null=True, blank=True,
        help_text="US dollars per day, for models with a price. Blank: the site default; 0: no cap.")
    usd_per_month = models.DecimalField(
        max_digits=12, decimal_places=4, null=True, blank=True,
        help_text="Per calendar month. Blank: the site default; 0: no cap.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"allowance of {self.user}"


class SpendCounter(models.Model):
    """What a user's model calls used in one day or month of the time zone it started in,
    reservations of calls in flight included (orchestration/budgets/spending.py). A new period is
    a new row, so nothing has to be reset at midnight and past periods stay as history;
    `starts_on` labels it (its first local day, kept unique per user and kind)."""

    class Period(models.TextChoices):
        DAY = "day"
        MONTH = "month"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="spend_counters")
    period = models.CharField(max_length=8, choices=Period.choices)
    starts_on = models.DateField()
    # The period keeps the zone it started in and ends at a midnight (first of the month)
    # of that zone: a time-zone change applies from the next period, so it cannot reset one.
    time_zone = models.CharField(max_length=64, blank=True)
    ends_at = models.DateTimeField()
    tokens = models.BigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=16, decimal_places=10, default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["user_id", "-starts_on", "period"]
        constraints = [models.UniqueConstraint(fields=["user", "period", "starts_on"], name="spend_counter_unique")]
        # Every model call reads the user's current periods (`ends_at` after now): two
        # rows found directly, however many past periods the user has.
        indexes = [models.Index(fields=["user", "ends_at"], name="spend_counter_current")]

    def __str__(self) -> str:
        return f"{self.user} {self.period} from {self.starts_on}"


class UserSpend(User):
    """Users as the spending page of the admin lists them (a proxy: no table)."""

    class Meta:
        proxy = True
        verbose_name = "user's spending"
        verbose_name_plural = "users' spending"


class ProviderCapacity(models.Model):
    """The shared accounting of a provider's rate limits on PostgreSQL without Redis
    (orchestration/llm/capacity/stores.py): one row per (endpoint, model) with its
    buckets, hold and priority mark, and one per endpoint with its calls in flight.
    The key names the endpoint by base URL and a hash of its key, never the key."""

    key = models.CharField(max_length=500, unique=True)
    state = models.JSONField(default=dict)

    def __str__(self) -> str:
        return self.key
