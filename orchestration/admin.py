"""The audit trail for staff: conversation → turns → dispatches → skill executions.

Records are read-only for everyone but superusers (who may fix data by hand); events
are read-only for everyone, because they are append-only facts.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from orchestration.models import (
    AgentDispatch,
    AgentProfile,
    Conversation,
    Event,
    LLMCall,
    Message,
    SkillExecution,
    Turn,
    TurnPause,
)
from orchestration.pricing import format_usd
from orchestration.usage import turn_spend


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
    """Read-only unless the user is a superuser."""

    def has_add_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


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
    fields = ["seq", "role", "content", "tool_call_id"]
    readonly_fields = fields
    show_change_link = False


class DispatchInline(ReadOnlyInline):
    model = AgentDispatch
    fk_name = "turn"
    fields = ["agent_id", "parent", "profile_name", "state", "outcome", "depends_on", "tool_calls_used", "duration_ms"]
    readonly_fields = fields


class PauseInline(ReadOnlyInline):
    model = TurnPause
    fields = ["limit", "tripped_at", "decision", "decided_by", "decided_at"]
    readonly_fields = fields
    show_change_link = False


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
    @admin.display(description="cost", ordering="cost_usd", empty_value="no price")
    def cost(self, obj):
        return format_usd(obj.cost_usd) or None


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
    readonly_fields = ["audit_view_link", "events_link", "created_at", "updated_at"]
    inlines = [TurnInline, MessageInline]

    @admin.display(description="dashboard")
    def audit_view_link(self, obj):
        return format_html('<a href="{}">Audit view</a>', reverse("conversation_audit", args=[obj.pk]))

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("owner")


@admin.register(Turn)
class TurnAdmin(EventLinksMixin, AuditAdmin):
    event_filter = "turn__id__exact"
    list_display = ["id", "conversation", "owner", "number", "status", "agents_dispatched", "skill_calls", "llm_iterations", "started_at"]
    list_filter = ["status", "started_at", "conversation__owner"]
    search_fields = ["conversation__title", "conversation__owner__username", "messages__content"]
    date_hierarchy = "started_at"
    readonly_fields = ["usage", "events_link", "started_at", "finished_at"]
    inlines = [PauseInline, DispatchInline, LLMCallInline]

    @admin.display(description="tokens and cost")
    def usage(self, obj):
        spend = turn_spend(obj)
        return f"{spend.total.summary()} (the orchestrator: {spend.orchestrator.summary()})"

    @admin.display(ordering="conversation__owner__username")
    def owner(self, obj):
        return obj.conversation.owner

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("conversation__owner")


@admin.register(AgentDispatch)
class AgentDispatchAdmin(EventLinksMixin, AuditAdmin):
    event_filter = "dispatch__id__exact"
    list_display = ["id", "agent_id", "turn", "parent", "profile_name", "state", "outcome", "tool_calls_used", "attempts", "duration_ms", "created_at"]
    list_filter = ["state", "outcome", "profile_name", "created_at", "turn__conversation__owner"]
    search_fields = ["agent_id", "mission", "result", "turn__conversation__title"]
    date_hierarchy = "created_at"
    readonly_fields = ["usage", "events_link", "turn_link", "parent_link", "created_at"]
    inlines = [SkillExecutionInline, ChildDispatchInline, LLMCallInline]

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
    list_filter = ["status", "skill", "started_at", "dispatch__turn__conversation__owner"]
    search_fields = ["skill", "tool_call_id", "error", "dispatch__agent_id"]
    date_hierarchy = "started_at"
    readonly_fields = ["dispatch_link", "parent_link", "started_at"]
    inlines = [ChildExecutionInline]

    @admin.display(description="dispatch")
    def dispatch_link(self, obj):
        return admin_link(obj.dispatch)

    @admin.display(description="parent execution")
    def parent_link(self, obj):
        return admin_link(obj.parent)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("dispatch", "parent")


@admin.register(Event)
class EventAdmin(StaffCanViewMixin, admin.ModelAdmin):
    list_display = ["id", "created_at", "type", "summary", "conversation", "turn", "dispatch"]
    list_filter = ["type", "created_at", "conversation__owner"]
    search_fields = ["summary", "type"]
    date_hierarchy = "created_at"
    list_select_related = ["conversation", "turn", "dispatch"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(LLMCall)
class LLMCallAdmin(CallCostMixin, AuditAdmin):
    list_display = ["id", "key", "turn", "dispatch", "model", "prompt_tokens", "completion_tokens", "cached_tokens", "cost", "duration_ms", "created_at"]
    list_filter = ["model", "created_at"]
    search_fields = ["key"]
    date_hierarchy = "created_at"


@admin.register(Message)
class MessageAdmin(AuditAdmin):
    list_display = ["id", "conversation", "turn", "seq", "role", "short_content", "tool_call_id"]
    list_filter = ["role", "created_at"]
    search_fields = ["content", "tool_call_id"]

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


@admin.register(TurnPause)
class TurnPauseAdmin(AuditAdmin):
    list_display = ["id", "turn", "limit", "tripped_at", "decision", "decided_by", "decided_at"]
    list_filter = ["limit", "decision", "tripped_at"]


@admin.register(AgentProfile)
class AgentProfileAdmin(admin.ModelAdmin):
    """Profiles are configuration, editable by staff with the usual permissions."""

    list_display = ["name", "description", "read_only", "max_tool_calls", "model", "may_delegate", "version", "updated_at"]
    list_filter = ["read_only", "may_delegate"]
    search_fields = ["name", "description"]
    readonly_fields = ["version", "updated_at"]
