"""Thin views: validate, call a service or selector, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from assistant.decorators import owned_conversation
from orchestration import selectors, services
from orchestration.pauses import AlreadyAnswered, turn_continue
from orchestration.turns import TurnRefused, turn_start, turn_stop


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
            "active_turn": selectors.active_turn(conversation=conversation),
            "pause": selectors.open_pause(conversation=conversation),
        },
    )


@require_POST
@owned_conversation
def message_send(request, conversation):
    try:
        turn_start(conversation=conversation, text=request.POST.get("text", ""))
    except TurnRefused as exc:
        messages.error(request, str(exc))
    return redirect(conversation)


@require_POST
@owned_conversation
def turn_continue_view(request, conversation, turn_id: int):
    turn = get_object_or_404(conversation.turns, pk=turn_id)
    try:
        turn_continue(turn=turn, user=request.user)
    except (AlreadyAnswered, TurnRefused) as exc:
        messages.warning(request, str(exc))
        return redirect(conversation) if not request.htmx else HttpResponse(str(exc), status=409)
    return redirect(conversation)


@require_POST
@owned_conversation
def turn_stop_view(request, conversation, turn_id: int):
    turn = get_object_or_404(conversation.turns, pk=turn_id)
    try:
        turn_stop(turn=turn, user=request.user)
    except TurnRefused as exc:
        messages.warning(request, str(exc))
        return redirect(conversation) if not request.htmx else HttpResponse(str(exc), status=409)
    return redirect(conversation)


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")
