"""The outbox: every email a user's assistant sent, with the Message-ID it carried."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

SUBJECT_MAX = 300
BODY_MAX = 20_000


class OutboxEmail(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sent_emails"
    )
    to = models.JSONField(default=list)
    subject = models.CharField(max_length=SUBJECT_MAX)
    body = models.TextField()
    message_id = models.CharField(max_length=255, unique=True)
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent_at", "-id"]
        verbose_name = "outbox email"
        indexes = [models.Index(fields=["owner", "-sent_at"], name="outbox_owner_sent")]

    def __str__(self) -> str:
        return self.subject
