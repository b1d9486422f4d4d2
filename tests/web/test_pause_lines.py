"""A pause reads the same in the audit page, its export and the admin: what the turn
paused on in words, how it was answered (an approval approved or denied, a limit
continued or stopped), times in the viewer's zone to the second (issue 28 item 5)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from assistant.models import Preferences
from orchestration.models import SkillApproval, TurnPause
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db
AT = datetime(2026, 11, 24, 20, 15, 7, 123456, tzinfo=UTC)


@pytest.fixture
def paused_turn(alice):
    conversation = conversation_for(alice, title="Pauses")
    turn = turn_for(conversation, status="completed")
    mailer = dispatch_for(turn, "mailer")
    TurnPause.objects.create(turn=turn, limit="turn_max_agents", detail={"limit": 2, "used": 2, "requested": 1},
                             decision="continue", decided_by=alice, decided_at=AT)
    for decision in ("approved", "denied"):
        pause = TurnPause.objects.create(turn=turn, limit="approval", decision="continue", decided_by=alice,
                                         decided_at=AT)
        SkillApproval.objects.create(turn=turn, dispatch=mailer, pause=pause, skill="email.send", digest=decision,
                                     decision=decision, decided_by=alice, decided_at=AT)
    TurnPause.objects.filter(turn=turn).update(tripped_at=AT)
    return turn


def test_the_audit_page_says_what_it_paused_on_and_how_it_was_answered(alice, alice_client, paused_turn):
    Preferences.objects.create(user=alice, time_zone="Asia/Tokyo")  # 20:15 UTC is 05:15 the next morning there
    url = reverse("conversation_audit", args=[paused_turn.conversation_id])
    page = alice_client.get(url).content.decode()
    assert ("Paused on agents per turn at 25 Nov 2026, 05:15:07 — continued by alice at 25 Nov 2026, 05:15:07"
            in page)
    assert "Paused on approval of email.send at 25 Nov 2026, 05:15:07 — approved by alice" in page
    assert "Paused on approval of email.send at 25 Nov 2026, 05:15:07 — denied by alice" in page
    assert "turn_max_agents" not in page and ".123456" not in page
    export = alice_client.get(reverse("conversation_export", args=[paused_turn.conversation_id])).json()
    assert [(p["label"], p["answer"]) for p in export["turns"][0]["pauses"]] == [
        ("agents per turn", "continued"), ("approval of email.send", "approved"),
        ("approval of email.send", "denied")]


def test_the_admins_pause_tables_say_the_same(client, staff, paused_turn):
    client.force_login(staff)
    listing = client.get(reverse("admin:orchestration_turnpause_changelist")).content.decode()
    turn_page = client.get(reverse("admin:orchestration_turn_change", args=[paused_turn.pk])).content.decode()
    for page in (listing, turn_page):
        assert "agents per turn" in page and "approval of email.send" in page
        assert ">approved<" in page and ">denied<" in page and ">continued<" in page
