"""Thin views: validate, call a service or selector, render."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from assistant.decorators import owned_conversation
from orchestration import selectors, services


@require_GET
@login_required
def conversation_list(request):
    conversations = selectors.conversations_for(user=request.user)
    return render(request, "conversations/list.html", {"conversations": conversations})


@require_POST
@login_required
def conversation_create(request):
    conversation = services.conversation_create(owner=request.user)
    return redirect(conversation)


@require_GET
@owned_conversation
def conversation_detail(request, conversation):
    return render(
        request,
        "conversations/detail.html",
        {
            "conversation": conversation,
            "messages_": selectors.visible_messages(conversation=conversation),
        },
    )


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")
