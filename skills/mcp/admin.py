"""The admin's page for MCP servers: staff plug a server in, choose who may use it, and
see the tools it offers now (the domain the orchestrator will read)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver
from django.utils.html import format_html, format_html_join

from skills.mcp import config
from skills.mcp.models import McpServer


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    list_display = ["__str__", "transport", "target", "who", "trust_read_only", "write_policy", "enabled"]
    list_filter = ["transport", "enabled", "everyone"]
    search_fields = ["name", "description", "command", "url"]
    filter_horizontal = ["users", "groups"]
    readonly_fields = ["tools_now"]
    fieldsets = [
        (None, {"fields": ["name", "description", "enabled"]}),
        ("How to reach it", {"fields": ["transport", "command", "args", "env_names", "url", "header_env",
                                        "timeout_seconds"],
                             "description": "Secrets stay in the workers' environment: name the variables, "
                                            "never their values."}),
        ("What it may do", {"fields": ["trust_read_only", "write_policy"]}),
        ("Who may use it", {"fields": ["everyone", "users", "groups"]}),
        ("Now", {"fields": ["tools_now"]}),
    ]

    @admin.display(description="command or URL")
    def target(self, server: McpServer) -> str:
        return server.url if server.transport == McpServer.Transport.HTTP else " ".join([server.command, *server.args])

    @admin.display(description="who")
    def who(self, server: McpServer) -> str:
        return "everyone" if server.everyone else "chosen users and groups"

    @admin.display(description="tools it offers now")
    def tools_now(self, server: McpServer):
        """Asked of the server when the page opens (this process connects to it)."""
        if not server.pk or not server.enabled:
            return "—"
        from skills.mcp.client import hub
        from skills.mcp.skills import domain_of

        found = config.servers().get(server.name)
        if found is None:
            return "—"
        try:
            domain = domain_of(found, hub().tools(found))
        except Exception as exc:  # noqa: BLE001 - a server down or broken: the page says why
            return format_html('<span class="errornote">Unavailable: {}</span>', str(exc)[:300])
        rows = format_html_join("", "<li><code>{}</code> ({}): {}</li>",
                                ((s.name, "reads" if s.read_only else "writes", s.description[:160])
                                 for s in domain.skills))
        return format_html("<ul>{}</ul>", rows) if domain.skills else "no tools"


@receiver([post_save, post_delete], sender=McpServer)
@receiver(m2m_changed, sender=McpServer.users.through)
@receiver(m2m_changed, sender=McpServer.groups.through)
def _forget_servers(**kwargs) -> None:
    """This process reads the servers again at once; the others within
    ASSISTANT_MCP_CONFIG_SECONDS."""
    config.forget()
