"""What the web side keeps per user."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Preferences(models.Model):
    """A user's settings. `time_zone` is blank until the browser reports one (first
    visit) or the user picks one; blank means settings.TIME_ZONE."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences")
    time_zone = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "preferences"

    def __str__(self) -> str:
        return f"Preferences of {self.user}"


class RequestStamp(models.Model):
    """One admitted request of a rate-limited kind (a conversation made, a message sent),
    kept for one window (assistant/ratelimits.py).

    Counted instead of the conversations and turns themselves, so that deleting or
    pruning them gives no allowance back; the window's stamps are all a user has here
    (older ones go as new ones come)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=32)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["user", "action", "at"], name="request_stamp_window")]

    def __str__(self) -> str:
        return f"{self.action} by {self.user_id} at {self.at:%Y-%m-%d %H:%M:%S}"
