"""Things the user asked the assistant to remember."""

from __future__ import annotations

from django.conf import settings
from django.db import models

TEXT_MAX = 4000


class Memory(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories"
    )
    text = models.TextField()
    tags = models.JSONField(default=list, blank=True)
    # Typed by the user themselves (the admin, an import); False for what an agent saved,
    # which is outside content when found again (Skill.outside).
    typed_by_user = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "memories"
        indexes = [models.Index(fields=["owner", "-created_at"], name="memory_owner_recent")]

    def __str__(self) -> str:
        return self.text[:60]
