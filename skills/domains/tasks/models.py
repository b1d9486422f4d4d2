"""A user's to-do items."""

from __future__ import annotations

from django.conf import settings
from django.db import models

TITLE_MAX = 200
NOTES_MAX = 4000


class Task(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        DONE = "done"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tasks"
    )
    title = models.CharField(max_length=TITLE_MAX)
    notes = models.TextField(blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    due = models.DateField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The outside content that had reached the agent that wrote this row (skills/context.py):
    # reading the row back is outside content again. Empty for what the owner wrote.
    provenance = models.JSONField(default=list, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = [models.F("due").asc(nulls_last=True), "id"]
        indexes = [models.Index(fields=["owner", "status", "due"], name="task_owner_status_due")]

    def __str__(self) -> str:
        return self.title
