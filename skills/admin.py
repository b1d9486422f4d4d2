"""Admin pages for the skill domains' records and the circuit breakers.

Staff may look at everything (they audit what agents did on users' behalf); changing
records stays with those who hold the model permissions.
"""

from __future__ import annotations

from django.contrib import admin

from skills.mcp import admin as mcp_admin  # noqa: F401 - the MCP servers' page
from skills.models import CalendarEvent, Memory, OutboxEmail, SkillCircuit, Task


class StaffCanView:
    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff


@admin.register(Task)
class TaskAdmin(StaffCanView, admin.ModelAdmin):
    list_display = ["title", "owner", "status", "due", "created_at", "completed_at"]
    list_filter = ["status", "due"]
    search_fields = ["title", "notes", "owner__username"]
    list_select_related = ["owner"]
    raw_id_fields = ["owner"]
    # What outside content the writing agent had seen: cleared by hand, a row's text
    # would no longer count as outside content when an agent reads it back.
    readonly_fields = ["provenance"]
    date_hierarchy = "created_at"


@admin.register(CalendarEvent)
class CalendarEventAdmin(StaffCanView, admin.ModelAdmin):
    list_display = ["title", "owner", "start", "duration_minutes", "status"]
    list_filter = ["status", "start"]
    search_fields = ["title", "owner__username"]
    list_select_related = ["owner"]
    raw_id_fields = ["owner"]
    readonly_fields = ["end", "provenance"]  # provenance: as TaskAdmin's
    date_hierarchy = "start"


@admin.register(OutboxEmail)
class OutboxEmailAdmin(StaffCanView, admin.ModelAdmin):
    """Sent mail is a record of fact: nobody adds, edits or deletes it afterwards, superusers
    included (as with the audit trail, orchestration/admin.py)."""

    list_display = ["subject", "owner", "recipients", "sent_at", "message_id"]
    list_filter = ["sent_at"]
    search_fields = ["subject", "body", "message_id", "owner__username"]
    list_select_related = ["owner"]
    date_hierarchy = "sent_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="to")
    def recipients(self, email: OutboxEmail) -> str:
        return ", ".join(email.to)


@admin.register(Memory)
class MemoryAdmin(StaffCanView, admin.ModelAdmin):
    list_display = ["__str__", "owner", "tag_list", "created_at"]
    list_filter = ["created_at"]
    search_fields = ["text", "owner__username"]
    list_select_related = ["owner"]
    raw_id_fields = ["owner"]

    @admin.display(description="tags")
    def tag_list(self, memory: Memory) -> str:
        return ", ".join(memory.tags)


@admin.register(SkillCircuit)
class SkillCircuitAdmin(StaffCanView, admin.ModelAdmin):
    """A superuser may reset a breaker by hand (failures to 0, opened_until empty).
    A row without an owner is the skill's circuit for everyone."""

    list_display = ["skill", "owner", "consecutive_failures", "opened_until", "updated_at"]
    list_filter = [("opened_until", admin.EmptyFieldListFilter), ("owner", admin.EmptyFieldListFilter)]
    search_fields = ["skill"]
    raw_id_fields = ["owner"]

