"""The audit trail for staff: conversation → turns → dispatches → skill executions.

Every record here is read-only for everyone, superusers included: an audit anyone can
edit proves nothing. Rows leave only through the code that owns them (events only through
orchestration/reports/retention.py: pruning, an owner deleting a conversation, a superuser deleting a user).
Agent profiles are configuration, not audit, and stay editable.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join

from orchestration.budgets.pricing import format_usd
from orchestration.budgets.spending import spend_use
from orchestration.budgets.usage import turn_spend
from orchestration.models import (
    AgentDispatch,
    AgentProfile,
    Conversation,
    Event,
    LLMCall,
    Message,
    SkillApproval,
    SkillExecution,
    SpendAllowance,
    Turn,
    TurnPause,
    UserSpend,
)
from orchestration.questions.approvals import clearance_words
from orchestration.questions.pauses import pause_answer, pause_label
from orchestration.reports import retention


def pretty_json(value) -> str:
    """Indented and escaped: payloads carry model output and users' words."""
    if value in (None, "", [], {}):
        return "-"
    text = json.dumps(value, indent=2, ensure_ascii=False, cls=DjangoJSONEncoder)
    return format_html('<pre class="audit-json">{}</pre>', text)


def json_display(field_name: str, description: str | None = None):
    """An admin display method for a JSON column, in place of Django's one-line dump."""

    @admin.display(description=description or field_name.replace("_", " "))
    def display(self, obj):
        return pretty_json(getattr(obj, field_name))

    return display


def json_fields(model) -> list[str]:
    return [f.name for f in model._meta.concrete_fields if isinstance(f, models.JSONField)]


def precise_time(value) -> str:
    """To the millisecond, in the viewer's time zone: events a few ms apart stay in order."""
    if value is None:
        return "-"
    local = timezone.localtime(value)
    return local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d} " + local.strftime("%Z")


def tool_call_arguments(arguments):
    """The model sends arguments as JSON text; show them parsed when they parse."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def tool_calls_html(calls: list[dict]) -> str:
    """Calls as stored on an assistant message (OpenAI's shape): name, id, arguments indented."""
    if not calls:
        return "-"
    rows = []
    for call in calls:
        function = call.get("function") or {}
        arguments = pretty_json(tool_call_arguments(function.get("arguments")))
        rows.append((function.get("name", "?"), call.get("id", ""), arguments))
    return format_html_join(
        "", '<div class="audit-tool-call"><strong>{}</strong> <span class="quiet">{}</span>{}</div>', rows
    )


def admin_link(obj, label: str | None = None) -> str:
    if obj is None:
        return "-"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


class StaffCanViewMixin:
    """Every staff member is an auditor: they may read the trail without extra grants."""

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff


class AuditAdmin(StaffCanViewMixin, admin.ModelAdmin):
    """Read-only for everyone, superusers included (and so no delete action either).

    JSON columns are left out of the form and shown by `<field>_json` display methods
    (`json_display`) listed in `readonly_fields`, indented instead of on one line.
    """

    class Media:
        css = {"all": ["css/admin-audit.css"]}

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_exclude(self, request, obj=None):
        return [*(super().get_exclude(request, obj) or []), *json_fields(self.model)]


class RecentOrChosenFilter(admin.SimpleListFilter):
    """A filter by one row of a big table: it offers the latest few and the one chosen
    (e.g. from a turn's "N events" link), where Django's related-field filter would load
    every turn or dispatch on each page view."""

    shown = 15

    def candidates(self, request) -> models.QuerySet:
        raise NotImplementedError

    def label(self, obj) -> str:
        return str(obj)

    def lookups(self, request, model_admin):
        rows = list(self.candidates(request).order_by("-pk")[: self.shown])
        chosen = self.value()
        if chosen and chosen.isdigit() and all(str(row.pk) != chosen for row in rows):
            rows = [*self.candidates(request).filter(pk=chosen), *rows]
        return [(str(row.pk), self.label(row)) for row in rows]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if not value.isdigit():
            return queryset.none()
        return queryset.filter(**{self.parameter_name: value})


class TurnFilter(RecentOrChosenFilter):
    title = "turn"
    parameter_name = "turn__id__exact"

    def candidates(self, request):
        return Turn.objects.select_related("conversation").only(
            "number", "conversation__title", "conversation__id")


class DispatchTurnFilter(TurnFilter):
    # not "…__id__exact": the admin allows a lookup across two relations only when it is
    # a list filter's parameter up to the field ("dispatch__turn__id")
    parameter_name = "dispatch__turn__id"


class DispatchFilter(RecentOrChosenFilter):
    """With a turn chosen, that turn's dispatches."""

    title = "dispatch"
    parameter_name = "dispatch__id__exact"

    def candidates(self, request):
        rows = AgentDispatch.objects.only("agent_id", "turn_id")
        turn = request.GET.get(TurnFilter.parameter_name) or request.GET.get(DispatchTurnFilter.parameter_name)
        if turn and turn.isdigit():
            rows = rows.filter(turn_id=turn)
        return rows

    def label(self, obj):
        return f"{obj.agent_id} (#{obj.pk}, turn #{obj.turn_id})"


class ReadOnlyInline(StaffCanViewMixin, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TurnInline(ReadOnlyInline):
    model = Turn
    fields = ["number", "status", "agents_dispatched", "skill_calls", "llm_iterations", "started_at", "finished_at"]
    readonly_fields = fields


class MessageInline(ReadOnlyInline):
    model = Message
    fields = ["seq", "role", "content", "tool_calls_json", "tool_call_id"]
    readonly_fields = fields
    show_change_link = True

    tool_calls_json = json_display("tool_calls", "tool calls")


class DispatchInline(ReadOnlyInline):
    model = AgentDispatch
    fk_name = "turn"
    fields = ["agent_id", "parent", "profile_name", "state", "outcome", "depends_on", "tool_calls_used", "duration_ms"]
    readonly_fields = fields


class PauseWordsMixin:
    """A pause as the audit page says it: what it was on, how it was answered (an
    approval approved or denied, not "Continue")."""

    @admin.display(description="paused on", ordering="limit")
    def paused_on(self, obj):
        return pause_label(obj)

    @admin.display(description="answer", ordering="decision")
    def answer(self, obj):
        return pause_answer(obj)


class PauseInline(PauseWordsMixin, ReadOnlyInline):
    model = TurnPause
    fields = ["paused_on", "tripped_at", "answer", "decided_by", "decided_at"]
    readonly_fields = fields
    show_change_link = False


class ApprovalInline(ReadOnlyInline):
    model = SkillApproval
    fk_name = "turn"
    fields = ["skill", "dispatch", "decision", "decided_by", "decided_at", "execution_id"]
    readonly_fields = fields


class SkillExecutionInline(ReadOnlyInline):
    model = SkillExecution
    fields = ["skill", "status", "parent", "tool_call_id", "duration_ms", "started_at"]
    readonly_fields = fields


class ChildExecutionInline(SkillExecutionInline):
    fk_name = "parent"
    verbose_name = "nested skill execution"
    verbose_name_plural = "nested skill executions"


class ChildDispatchInline(DispatchInline):
    fk_name = "parent"
    verbose_name = "nested dispatch"
    verbose_name_plural = "nested dispatches"


class CallCostMixin:
    @admin.display(description="cost", ordering="cost_usd")
    def cost(self, obj):
        # The words themselves, not None: a change page's read-only field shows None as "None".
        return format_usd(obj.cost_usd) or "no price"


class LLMCallInline(CallCostMixin, ReadOnlyInline):
    model = LLMCall
    fields = ["key", "model", "prompt_tokens", "completion_tokens", "cached_tokens", "cost", "duration_ms"]
    readonly_fields = fields


class EventLinksMixin:
    """A link to the filtered event list, since inlines of thousands of events do not scale."""

    event_filter: str

    @admin.display(description="events")
    def events_link(self, obj):
        url = reverse("admin:orchestration_event_changelist") + f"?{self.event_filter}={obj.pk}"
        return format_html('<a href="{}">{} events</a>', url, obj.events.count())


@admin.register(Conversation)
class ConversationAdmin(EventLinksMixin, AuditAdmin):
    event_filter = "conversation__id__exact"
    list_display = ["id", "title", "owner", "created_at", "updated_at"]
    list_filter = ["owner", "created_at"]
    search_fields = ["title", "owner__username", "messages__content"]
    date_hierarchy = "created_at"
    readonly_fields = ["audit_view_link", "events_link", "outside_json", "outside_since", "created_at", "updated_at"]
    inlines = [TurnInline, MessageInline]

    outside_json = json_display("outside", "outside content its agents have read (later turns carry it)")

    @admin.display(description="dashboard")
    def audit_view_link(self, obj):
        return format_html('<a href="{}">Audit view</a>', reverse("conversation_audit", args=[obj.pk]))

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("owner")


@admin.register(Turn)
class TurnAdmin(EventLinksMixin, AuditAdmin):
    event_filter = TurnFilter.parameter_name
    list_display = ["id", "conversation", "owner", "number", "status", "agents_dispatched", "skill_calls", "llm_iterations", "started_at"]
    list_filter = ["status", "started_at", "conversation__owner"]
    search_fields = ["conversation__title", "conversation__owner__username", "messages__content"]
    date_hierarchy = "started_at"
    readonly_fields = ["usage", "events_link", "orchestrator_tool_calls", "limits_json", "awaiting_json",
                       "outside_json", "started_at", "finished_at", "pruned_at", "tombstone_json"]
    inlines = [PauseInline, ApprovalInline, DispatchInline, LLMCallInline]

    limits_json = json_display("limits")
    awaiting_json = json_display("awaiting")
    outside_json = json_display("outside", "outside content the orchestrator read")
    tombstone_json = json_display("tombstone", "what it held before it was pruned")

    @admin.display(description="tokens and cost")
    def usage(self, obj):
        spend = turn_spend(obj)
        return f"{spend.total.summary()} (the orchestrator: {spend.orchestrator.summary()})"

    @admin.display(description="the orchestrator's tool calls")
    def orchestrator_tool_calls(self, obj):
        messages = obj.messages.filter(role=Message.Role.ASSISTANT).exclude(tool_calls=[]).order_by("seq")
        return tool_calls_html([call for message in messages for call in message.tool_calls])

    @admin.display(ordering="conversation__owner__username")
    def owner(self, obj):
        return obj.conversation.owner

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("conversation__owner")


@admin.register(AgentDispatch)
class AgentDispatchAdmin(EventLinksMixin, AuditAdmin):
    event_filter = DispatchFilter.parameter_name
    list_display = ["id", "agent_id", "turn", "parent", "profile_name", "state", "outcome", "tool_calls_used", "crashes", "duration_ms", "created_at"]
    list_filter = ["state", "outcome", "profile_name", TurnFilter, "created_at", "turn__conversation__owner"]
    search_fields = ["agent_id", "mission", "result", "turn__conversation__title"]
    date_hierarchy = "created_at"
    readonly_fields = ["usage", "events_link", "turn_link", "parent_link", "skills_json", "depends_on_json",
                       "contract_json", "awaiting_json", "outside_json", "transcript_json", "created_at"]
    inlines = [SkillExecutionInline, ChildDispatchInline, LLMCallInline]

    outside_json = json_display("outside", "outside content that reached it")
    skills_json = json_display("skills")
    depends_on_json = json_display("depends_on", "depends on")
    contract_json = json_display("contract")
    awaiting_json = json_display("awaiting")
    transcript_json = json_display("transcript")

    @admin.display(description="tokens and cost")
    def usage(self, obj):
        spend = turn_spend(obj.turn)
        own, total = spend.agent(obj.pk), spend.agent_total(obj.pk)
        return own.summary() + (f"; with the agents it delegated to: {total.summary()}" if total != own else "")

    @admin.display(description="turn")
    def turn_link(self, obj):
        return admin_link(obj.turn)

    @admin.display(description="parent dispatch")
    def parent_link(self, obj):
        return admin_link(obj.parent)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("turn__conversation", "parent")


@admin.register(SkillExecution)
class SkillExecutionAdmin(AuditAdmin):
    list_display = ["id", "skill", "status", "dispatch", "parent", "tool_call_id", "duration_ms", "started_at"]
    list_filter = ["status", "skill", DispatchTurnFilter, DispatchFilter, "started_at", "dispatch__turn__conversation__owner"]
    search_fields = ["skill", "tool_call_id", "error", "dispatch__agent_id"]
    date_hierarchy = "started_at"
    readonly_fields = ["dispatch_link", "parent_link", "clearance_words", "arguments_json", "result_json",
                       "clearance_json", "outside_json", "started_at"]
    inlines = [ChildExecutionInline]

    arguments_json = json_display("arguments")
    result_json = json_display("result")
    clearance_json = json_display("clearance", "clearance (by whose word it ran)")
    outside_json = json_display("outside", "outside content in its result")

    @admin.display(description="ran on")
    def clearance_words(self, obj):
        return clearance_words(obj.clearance)

    @admin.display(description="dispatch")
    def dispatch_link(self, obj):
        return admin_link(obj.dispatch)

    @admin.display(description="parent execution")
    def parent_link(self, obj):
        return admin_link(obj.parent)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("dispatch", "parent")


@admin.register(SkillApproval)
class SkillApprovalAdmin(AuditAdmin):
    list_display = ["id", "skill", "turn", "dispatch", "decision", "decided_by", "decided_at", "execution_id", "created_at"]
    list_filter = ["decision", "skill", TurnFilter, DispatchFilter, "created_at", "turn__conversation__owner"]
    search_fields = ["skill", "dispatch__agent_id"]
    list_select_related = ["turn__conversation", "dispatch", "decided_by"]
    readonly_fields = ["arguments_json", "reasons_json", "outside_json", "created_at"]

    arguments_json = json_display("arguments")
    reasons_json = json_display("reasons", "why it asked")
    outside_json = json_display("outside", "outside content that reached the call")


@admin.register(Event)
class EventAdmin(AuditAdmin):
    list_display = ["id", "time", "type", "summary", "conversation", "turn", "dispatch"]
    list_filter = ["type", TurnFilter, DispatchFilter, "created_at", "conversation__owner"]
    search_fields = ["summary", "type"]
    date_hierarchy = "created_at"
    list_select_related = ["conversation", "turn", "dispatch"]
    readonly_fields = ["time", "payload_json"]

    payload_json = json_display("payload")

    @admin.display(description="time", ordering="created_at")
    def time(self, obj):
        return precise_time(obj.created_at)


@admin.register(LLMCall)
class LLMCallAdmin(CallCostMixin, AuditAdmin):
    list_display = ["id", "key", "turn", "dispatch", "model", "prompt_tokens", "completion_tokens", "cached_tokens", "cost", "duration_ms", "time"]
    list_filter = ["model", TurnFilter, DispatchFilter, "created_at"]
    search_fields = ["key"]
    date_hierarchy = "created_at"
    list_select_related = ["turn__conversation", "dispatch"]
    readonly_fields = ["time", "cost", "response_json"]

    response_json = json_display("response")

    @admin.display(description="time", ordering="created_at")
    def time(self, obj):
        return precise_time(obj.created_at)


@admin.register(Message)
class MessageAdmin(AuditAdmin):
    list_display = ["id", "conversation", "turn", "seq", "role", "short_content", "tool_call_id"]
    list_filter = ["role", TurnFilter, "created_at"]
    search_fields = ["content", "tool_call_id"]
    list_select_related = ["conversation", "turn__conversation"]
    readonly_fields = ["tool_calls_json", "created_at"]

    tool_calls_json = json_display("tool_calls", "tool calls")

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


@admin.register(TurnPause)
class TurnPauseAdmin(PauseWordsMixin, AuditAdmin):
    list_display = ["id", "turn", "paused_on", "tripped_at", "answer", "decided_by", "decided_at"]
    list_select_related = ["turn__conversation", "decided_by", "approval"]
    list_filter = ["limit", "decision", TurnFilter, "tripped_at"]
    readonly_fields = ["detail_json", "tripped_at"]

    detail_json = json_display("detail")


@admin.register(AgentProfile)
class AgentProfileAdmin(admin.ModelAdmin):
    """Profiles are configuration, editable by staff with the usual permissions."""

    list_display = ["name", "description", "read_only", "max_tool_calls", "model", "may_delegate", "version", "updated_at"]
    list_filter = ["read_only", "may_delegate"]
    search_fields = ["name", "description"]
    readonly_fields = ["version", "updated_at"]


class StaffCanEditMixin(StaffCanViewMixin):
    """Allowances are staff's to set, without a separate grant."""

    def has_change_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff


class SpendAllowanceInline(StaffCanEditMixin, admin.StackedInline):
    model = SpendAllowance
    can_delete = False
    max_num = 1
    verbose_name = "own allowance (blank fields take the site default; 0 means no cap)"
    fields = ["tokens_per_day", "tokens_per_month", "usd_per_day", "usd_per_month"]


@admin.register(UserSpend)
class UserSpendAdmin(StaffCanEditMixin, admin.ModelAdmin):
    """Each user's model use today and this month (in their time zone) against their
    allowance; staff set a user's own allowance here (orchestration/budgets/spending.py). The
    figures include the estimates of calls in flight."""

    list_display = ["username", "today", "this_month"]
    search_fields = ["username", "email"]
    fields = ["username", "today", "this_month"]
    readonly_fields = fields
    inlines = [SpendAllowanceInline]

    def has_add_permission(self, request, obj=None):
        return False  # users are made in the users' admin

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("preferences")

    def _use(self, obj, index: int) -> str:
        cache = getattr(obj, "_spend_use", None)
        if cache is None:
            cache = obj._spend_use = spend_use(obj)
        use = cache[index]
        renews = formats.date_format(use.period.renews_at, "D j M, H:i")
        return f"{use.text()} (renews {renews}, {use.period.time_zone})"

    @admin.display(description="today")
    def today(self, obj):
        return self._use(obj, 0)

    @admin.display(description="this month")
    def this_month(self, obj):
        return self._use(obj, 1)


class UserDeletionMixin:
    """Deleting a user removes everything of theirs, the event log and their workspace
    included (orchestration/reports/retention.py `user_delete`): superusers only, and only
    through that service, for one user or a selection."""

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def get_deleted_objects(self, objs, request):
        """What goes with the user, listed as Django would, less the audit models' own
        "no delete" answer: they refuse deletion one by one, not with their owner."""
        to_delete, model_count, _, protected = retention.deletion_preview(super().get_deleted_objects, objs, request)
        return to_delete, model_count, set(), protected

    def delete_model(self, request, obj):
        retention.user_delete(user=obj)

    def delete_queryset(self, request, queryset):
        for user in queryset:
            retention.user_delete(user=user)


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class RetentionUserAdmin(UserDeletionMixin, UserAdmin):
    pass
