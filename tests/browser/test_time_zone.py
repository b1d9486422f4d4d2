"""A user's time zone in chromium: the browser reports its own on the first visit (once),
the pages then show times in it, and the picker on the conversation list changes it.

The browser's zone is Playwright's `timezone_id`, whatever the machine's is."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from assistant.models import Preferences
from orchestration.models import Event
from tests.factories import conversation_for, turn_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPORT = re.compile(r"/preferences/time-zone/$")
# 05:30:15 UTC on the 25th: 14:30:15 in Tokyo, 21:30:15 the evening before in Los Angeles
MOMENT = dt.datetime(2026, 11, 25, 5, 30, 15, tzinfo=dt.timezone.utc)


def event_at(user, moment: dt.datetime) -> Event:
    conversation = conversation_for(user, title="Review")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timezone, "now", lambda: moment)
        return Event.objects.create(conversation=conversation, turn=turn_for(conversation),
                                    type="turn.started", summary="Turn 1 started")


def test_the_browser_reports_its_zone_once_and_the_pages_show_times_in_it(servers, visit, alice):
    event = event_at(alice, MOMENT)
    tab = visit(servers(workers=0), timezone_id="Asia/Tokyo")
    with tab.page.expect_response(REPORT) as reported:
        tab.login("alice")
    assert (reported.value.request.method, reported.value.status) == ("POST", 204)
    assert Preferences.objects.get(user=alice).time_zone == "Asia/Tokyo"

    tab.goto(f"/conversations/{event.conversation_id}/")
    expect(tab.page.locator(f"#event-{event.pk} time")).to_have_text("14:30:15")
    tab.goto("/")
    expect(tab.page.locator("#time-zone")).to_have_value("Asia/Tokyo")
    assert [url for url in tab.requests if REPORT.search(url)] == [reported.value.url]  # once
    assert tab.console_errors == []


def test_the_picker_changes_the_zone(servers, visit, alice):
    event = event_at(alice, MOMENT)
    Preferences.objects.create(user=alice, time_zone="Asia/Tokyo")
    tab = visit(servers(workers=0), "alice", timezone_id="Asia/Tokyo")

    tab.page.select_option("#time-zone", "America/Los_Angeles")
    with tab.page.expect_navigation():
        tab.page.click("#time-zone-form button[type=submit]")
    expect(tab.page.locator("#time-zone")).to_have_value("America/Los_Angeles")
    assert Preferences.objects.get(user=alice).time_zone == "America/Los_Angeles"
    tab.goto(f"/conversations/{event.conversation_id}/")
    expect(tab.page.locator(f"#event-{event.pk} time")).to_have_text("21:30:15")
    assert len([url for url in tab.requests if REPORT.search(url)]) == 1  # the form's: she had a zone
