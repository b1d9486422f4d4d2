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
