"""The counters panel's tokens while agents run: an agent's usage reaches its turn only
when it ends, so until then the counters add what its row holds as of its last step."""

from __future__ import annotations

import pytest
from django.db.models import F
from django.utils import timezone

from orchestration.models import AgentDispatch, Turn
from orchestration.selectors import conversation_usage
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db


def test_running_agents_count_before_they_end_and_once_after(alice):
    conversation = conversation_for(alice)
    turn = turn_for(conversation, prompt_tokens=50, completion_tokens=5)
    running = dispatch_for(turn, "a1", state="running", prompt_tokens=100, completion_tokens=10, cached_tokens=4)
    dispatch_for(turn, "a2", state="completed", finished_at=timezone.now(), prompt_tokens=7)  # already in the turn

    assert conversation_usage(conversation=conversation)["total"] == 50 + 5 + 100 + 10
    assert conversation_usage(conversation=conversation)["cached"] == 4

    # It ends: its usage moves to the turn with finished_at, in one transaction.
    AgentDispatch.objects.filter(pk=running.pk).update(state="waiting_for_merge", finished_at=timezone.now())
    Turn.objects.filter(pk=turn.pk).update(prompt_tokens=F("prompt_tokens") + 100,
                                           completion_tokens=F("completion_tokens") + 10,
                                           cached_tokens=F("cached_tokens") + 4)
    assert conversation_usage(conversation=conversation)["total"] == 50 + 5 + 100 + 10
