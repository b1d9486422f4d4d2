"""A user's calendar events."""

from __future__ import annotations

from django.conf import settings
from django.db import models

TITLE_MAX = 200


class CalendarEvent(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        CANCELLED = "cancelled"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="calendar_events"
    )
    title = models.CharField(max_length=TITLE_MAX)
    start = models.DateTimeField()
    duration_minutes = models.PositiveIntegerField()
    # start + duration, stored so that range and overlap queries stay plain comparisons.
    end = models.DateTimeField(editable=False)
    invitees = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    # The outside content that had reached the agent that wrote this row (skills/context.py):
    # reading the row back is outside content again. Empty for what the owner wrote.
    provenance = models.JSONField(default=list, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["start", "id"]
        indexes = [
            models.Index(fields=["owner", "status", "start"], name="event_owner_status_start")
        ]

    def __str__(self) -> str:
        return f"{self.title} ({self.start:%Y-%m-%d %H:%M})"
