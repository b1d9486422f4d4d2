"""An MCP server staff plugged in: how to reach it and who may use its tools.

No secret is stored: `env_names` and `header_env` name variables of the worker's own
environment, read when the connection opens (skills/mcp/config.py).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models

NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def _check_name(value: str) -> None:
    if not NAME.match(value or ""):
        raise ValidationError("Lower-case letters, digits and _, starting with a letter (at most 40): "
                              "its tools are named mcp.<name>.<tool>.")


def _check_names(value) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
                                              for v in value):
        raise ValidationError("A list of environment variable names, e.g. [\"GITHUB_TOKEN\"].")


def _check_headers(value) -> None:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
            for k, v in value.items()):
        raise ValidationError("An object of header name → environment variable name, "
                              "e.g. {\"Authorization\": \"WIKI_TOKEN\"}.")


def _check_args(value) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError("A list of strings, e.g. [\"-m\", \"my_server\"].")


class McpServer(models.Model):
    class Transport(models.TextChoices):
        STDIO = "stdio", "stdio (a command the worker starts)"
        HTTP = "http", "streamable HTTP (a URL)"

    class WritePolicy(models.TextChoices):
        ALLOW = "allow", "run unasked"
        ASK = "ask", "ask the owner first"
        DENY = "deny", "refuse"

    name = models.CharField(max_length=40, unique=True, validators=[_check_name],
                            help_text="The domain is mcp.<name>; a tool's skill is mcp.<name>.<tool>.")
    description = models.CharField(max_length=300, blank=True,
                                   help_text="One line the orchestrator reads about the domain.")
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.STDIO)
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the program to start.")
    args = models.JSONField(default=list, blank=True, validators=[_check_args], help_text="stdio: its arguments.")
    url = models.CharField(max_length=500, blank=True, validators=[URLValidator(schemes=["http", "https"])],
                           help_text="streamable HTTP: the endpoint, e.g. http://127.0.0.1:8765/mcp")
    env_names = models.JSONField(
        default=list, blank=True, validators=[_check_names],
        help_text="stdio: environment variables passed on to the server, by name (their values are never stored).")
    header_env = models.JSONField(
        default=dict, blank=True, validators=[_check_headers],
        help_text="HTTP: headers whose values come from the worker's environment, header → variable name.")
    timeout_seconds = models.FloatField(default=30.0, help_text="How long one tool call may take.")
    trust_read_only = models.BooleanField(
        default=False, help_text="Believe the server's readOnlyHint: its read-only tools run unasked and are re-run "
                                 "after a crash. Off: every tool counts as changing something.")
    write_policy = models.CharField(
        max_length=8, choices=WritePolicy.choices, default=WritePolicy.ASK,
        help_text="What a tool that changes something does by default; owners' rules come first.")
    everyone = models.BooleanField(default=False, help_text="Every user may use it; otherwise the users and "
                                                            "groups below.")
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="mcp_servers")
    groups = models.ManyToManyField("auth.Group", blank=True, related_name="mcp_servers")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return f"mcp.{self.name}"

    def clean(self) -> None:
        if self.transport == self.Transport.STDIO and not self.command:
            raise ValidationError({"command": "A stdio server needs the command that starts it."})
        if self.transport == self.Transport.HTTP and not self.url:
            raise ValidationError({"url": "A streamable HTTP server needs its URL."})
        if not 0 < (self.timeout_seconds or 0) <= 600:
            raise ValidationError({"timeout_seconds": "Between 0 and 600 seconds."})
