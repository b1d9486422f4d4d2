"""View decorators shared by every page that shows a conversation."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404

from orchestration.models import Conversation


def owned_conversation(view):
    """Load the conversation named in the URL, or 404 unless the user owns it.

    404 rather than 403, so an outsider cannot even learn which ids exist.
    """

    @login_required
    @wraps(view)
    def wrapper(request, conversation_id: int, *args, **kwargs):
        conversation = get_object_or_404(Conversation, pk=conversation_id, owner=request.user)
        conversation.owner = request.user  # it is theirs: no query for it (nor for their preferences) again
        return view(request, conversation, *args, **kwargs)

    return wrapper


def audited_conversation(view):
    """Like owned_conversation, but staff may read any conversation's audit trail."""

    @login_required
    @wraps(view)
    def wrapper(request, conversation_id: int, *args, **kwargs):
        conversations = Conversation.objects.all()
        if not request.user.is_staff:
            conversations = conversations.filter(owner=request.user)
        conversation = get_object_or_404(conversations, pk=conversation_id)
        return view(request, conversation, *args, **kwargs)

    return wrapper
