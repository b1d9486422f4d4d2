"""Write-side operations on conversations (services named <noun>_<verb>)."""

from __future__ import annotations

from orchestration.models import Conversation


def conversation_create(*, owner, title: str = "") -> Conversation:
    return Conversation.objects.create(owner=owner, title=title.strip()[:200])
