"""A user's time zone on the web side: the picker and the browser's first-visit report
(POST with CSRF, the user's own setting only, bad names refused), and pages and live
pushes showing times in it. Los Angeles is west of UTC, Tokyo east."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from assistant import live
from assistant.models import Preferences
from assistant.routing import websocket_urlpatterns
from assistant.templatetags import rendering
from orchestration.models import Event
from orchestration.zones import time_zone_groups
from tests.factories import conversation_for, turn_for

pytestmark = pytest.mark.django_db

URL = reverse("time_zone_set")
# 05:30:15 UTC on the 25th: 21:30:15 the evening before in Los Angeles, 14:30:15 in Tokyo
MOMENT = dt.datetime(2026, 11, 25, 5, 30, 15, tzinfo=dt.timezone.utc)
SHOWN = {"America/Los_Angeles": "21:30:15", "Asia/Tokyo": "14:30:15", "": "05:30:15"}


def zone_of(user) -> str | None:
    return Preferences.objects.filter(user=user).values_list("time_zone", flat=True).first()


@pytest.fixture
def strict(alice) -> Client:
    """alice's browser: CSRF enforced, the token taken from a page as htmx and forms do."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.get(reverse("conversation_list"))
    client.token = client.cookies["csrftoken"].value
    return client


# --- setting it ----------------------------------------------------------------------------


def test_the_picker_stores_the_zone_and_goes_back_to_the_list(strict, alice):
    response = strict.post(URL, {"time_zone": "America/Los_Angeles", "csrfmiddlewaretoken": strict.token})
    assert response.status_code == 302 and response.url == reverse("conversation_list")
    assert zone_of(alice) == "America/Los_Angeles"
    page = strict.get(reverse("conversation_list")).content.decode()
    assert '<option value="America/Los_Angeles" selected>Los Angeles</option>' in page


def test_the_picker_offers_the_zones_people_live_in_grouped_by_area(alice_client, alice):
    """Not the tz database's 600 raw names: its aliases and relics ("Factory", "US/Eastern",
    "Etc/GMT+3") are left out, places read as words under their area; a legacy name
    stored earlier stays selected."""
    page = alice_client.get(reverse("conversation_list")).content.decode()
    picker = page[page.index('<select name="time_zone"'):page.index("</select>")]
    assert '<optgroup label="Europe">' in picker and '<option value="Europe/Paris">Paris</option>' in picker
    assert '<option value="America/Argentina/Buenos_Aires">Argentina / Buenos Aires</option>' in picker
    assert '<option value="UTC" selected>UTC</option>' in picker
    for relic in ("Factory", "US/Eastern", "EST5EDT", "Etc/GMT+3", "posix/", "right/"):
        assert f'value="{relic}' not in picker
    assert 300 < picker.count("<option") < 500
    Preferences.objects.create(user=alice, time_zone="US/Eastern")
    page = alice_client.get(reverse("conversation_list")).content.decode()
    assert '<option value="US/Eastern" selected>US/Eastern</option>' in page


def test_the_picker_is_built_once_per_zone_not_at_every_visit(alice_client, alice, bob, monkeypatch):
    """The conversation list is the home page; looping over the picker's four hundred
    zones in its template was most of its CPU. Each zone's options are built once per
    process, the zone a page shows still the one selected."""
    built = []
    monkeypatch.setattr(rendering, "time_zone_groups", lambda: built.append(1) or time_zone_groups())
    rendering._time_zone_options.cache_clear()
    for _ in range(3):
        assert '<option value="UTC" selected>UTC</option>' in alice_client.get(reverse("conversation_list")).content.decode()
    Preferences.objects.create(user=bob, time_zone="Asia/Tokyo")
    bobs = Client()
    bobs.force_login(bob)
    for _ in range(2):
        page = bobs.get(reverse("conversation_list")).content.decode()
        assert '<option value="Asia/Tokyo" selected>Tokyo</option>' in page and 'value="UTC" selected' not in page
    assert len(built) == 2  # UTC's, then Tokyo's


def test_the_picker_changes_a_zone_already_set(strict, alice):
    Preferences.objects.create(user=alice, time_zone="Asia/Tokyo")
    strict.post(URL, {"time_zone": "Europe/Paris"}, HTTP_X_CSRFTOKEN=strict.token)
    assert zone_of(alice) == "Europe/Paris"


def test_without_the_token_nothing_is_stored(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(URL, {"time_zone": "Asia/Tokyo"}).status_code == 403
    assert zone_of(alice) is None


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "", "localtime", "asia/tokyo", "../../etc/passwd", "X" * 500])
def test_a_name_that_is_no_time_zone_is_a_400_and_stores_nothing(strict, alice, name):
    response = strict.post(URL, {"time_zone": name}, HTTP_X_CSRFTOKEN=strict.token)
    assert response.status_code == 400
    assert "Unknown time zone" in response.content.decode()
    assert zone_of(alice) is None


def test_it_sets_only_the_users_own_zone(client, alice, bob):
    Preferences.objects.create(user=alice, time_zone="Asia/Tokyo")
    client.force_login(bob)
    client.post(URL, {"time_zone": "America/Los_Angeles", "user": alice.pk})
    assert (zone_of(alice), zone_of(bob)) == ("Asia/Tokyo", "America/Los_Angeles")


def test_anonymous_visitors_are_sent_to_log_in(client):
    response = client.post(URL, {"time_zone": "Asia/Tokyo"})
    assert response.status_code == 302 and response.url.startswith(reverse("login"))
    assert not Preferences.objects.exists()


# --- the browser's report on a first visit --------------------------------------------------


def test_a_first_visit_asks_the_browser_for_its_zone(alice_client, alice):
    page = alice_client.get(reverse("conversation_list")).content.decode()
    assert f'data-detect-time-zone="{URL}"' in page
    assert '<script src="/static/js/timezone.js" defer></script>' in page


def test_the_browsers_report_is_stored_once(strict, alice):
    response = strict.post(URL, {"time_zone": "Asia/Tokyo", "detected": "1"}, HTTP_X_CSRFTOKEN=strict.token)
    assert response.status_code == 204 and zone_of(alice) == "Asia/Tokyo"
    assert "data-detect-time-zone" not in strict.get(reverse("conversation_list")).content.decode()


def test_the_browsers_report_does_not_overwrite_a_zone_the_user_picked(strict, alice):
    Preferences.objects.create(user=alice, time_zone="Europe/Paris")
    response = strict.post(URL, {"time_zone": "Asia/Tokyo", "detected": "1"}, HTTP_X_CSRFTOKEN=strict.token)
    assert response.status_code == 204 and zone_of(alice) == "Europe/Paris"


def test_a_zone_that_stopped_being_valid_counts_as_none(alice_client, alice):
    Preferences.objects.create(user=alice, time_zone="Atlantis/Capital")
    page = alice_client.get(reverse("conversation_list")).content.decode()
    assert "data-detect-time-zone" in page and '<option value="UTC" selected>UTC</option>' in page


# --- showing times in it ---------------------------------------------------------------------


@pytest.fixture
def event(alice):
    """An event of alice's recorded at MOMENT (events are append-only: stamped as made)."""
    conversation = conversation_for(alice)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timezone, "now", lambda: MOMENT)
        return Event.objects.create(conversation=conversation, turn=turn_for(conversation),
                                    type="turn.started", summary="Turn 1 started")


@pytest.mark.parametrize("zone", list(SHOWN))
def test_a_page_shows_times_in_the_users_zone(alice_client, alice, event, zone):
    if zone:
        Preferences.objects.create(user=alice, time_zone=zone)
    page = alice_client.get(reverse("conversation_detail", args=[event.conversation_id])).content.decode()
    assert f">{SHOWN[zone]}</time>" in page
    assert timezone.get_current_timezone_name() == "UTC"  # the request's zone ended with it


def test_the_audit_export_gives_times_on_the_readers_clock(alice_client, alice, event):
    Preferences.objects.create(user=alice, time_zone="Asia/Tokyo")
    data = json.loads(alice_client.get(reverse("conversation_export", args=[event.conversation_id])).content)
    assert data["turns"][0]["events"][0]["created_at"] == "2026-11-25T14:30:15+09:00"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("zone", ["America/Los_Angeles", "Asia/Tokyo"])
async def test_a_live_push_shows_times_in_the_owners_zone(alice, event, zone):
    """daphne renders pushes outside any request: the consumer renders in the owner's zone."""
    await Preferences.objects.acreate(user=alice, time_zone=zone)
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/conversations/{event.conversation_id}/")
    comm.scope["user"] = alice
    comm.scope["url_route"] = {"kwargs": {"conversation_id": event.conversation_id}}
    try:
        assert (await comm.connect())[0]
        assert f">{SHOWN[zone]}</time>" in await comm.receive_from(timeout=3)
    finally:
        await comm.disconnect()


def test_the_render_cache_keeps_each_zone_apart(event):
    """Pushes rendered once per process are shared by sockets: the zone is in their key."""
    rendered = {}
    for zone in ("America/Los_Angeles", "Asia/Tokyo"):
        with timezone.override(zone):
            rendered[zone] = live.render_events(event.conversation, [event])
    assert f">{SHOWN['America/Los_Angeles']}</time>" in rendered["America/Los_Angeles"]
    assert f">{SHOWN['Asia/Tokyo']}</time>" in rendered["Asia/Tokyo"]
