"""The socket against a real daphne (issue 18): its origin check compares scheme, host and
port; one page too many is closed with 4429 and says so, without reconnecting; the other
pages and users carry on.

The origin tests need no browser: a browser always sends its page's own origin, so a
client that can send any Origin (websockets) plays the other site's page, with the
owner's real session cookie.
"""

from __future__ import annotations

import time

import pytest
from django.test import Client
from playwright.sync_api import expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from orchestration.models import Event
from orchestration.records.events import event_record
from tests.factories import conversation_for, turn_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def open_socket(site_url: str, path: str, *, origin: str, cookie: str):
    return connect(site_url.replace("http://", "ws://") + path, origin=origin, additional_headers={"Cookie": cookie},
                   proxy=None, open_timeout=10)


@pytest.fixture
def alices(alice):
    conversation = conversation_for(alice, title="Alice's plans")
    event_record(type="turn.started", turn=turn_for(conversation), summary="Turn 1 started")
    return conversation


def test_the_socket_opens_only_from_the_sites_own_scheme_host_and_port(servers, alices, alice):
    site = servers(workers=0, env={"CSRF_TRUSTED_ORIGINS": "https://app.example.com"})
    path, cookie = f"/ws/conversations/{alices.pk}/?last=0", session_cookie(alice)
    port = int(site.url.rsplit(":", 1)[1])
    for origin in (f"http://127.0.0.1:{port + 1}",  # another service on this host
                   f"https://127.0.0.1:{port}",  # the https twin of this http site
                   f"http://localhost:{port}",  # an allowed host, not the one the page is on
                   "http://127.0.0.1",  # port 80
                   "https://evil.example"):
        with pytest.raises(InvalidStatus) as refused:
            open_socket(site.url, path, origin=origin, cookie=cookie)
        assert refused.value.response.status_code == 403, origin
    # the page's own origin, and one the operator trusts, get alice's timeline
    for origin in (site.url, "https://app.example.com"):
        with open_socket(site.url, path, origin=origin, cookie=cookie) as socket:
            assert "Turn 1 started" in socket.recv(timeout=10), origin


def test_a_page_too_many_says_so_and_does_not_reconnect(servers, visit, alices, alice, bob):
    site = servers(workers=0, env={"ASSISTANT_SOCKETS_PER_CONVERSATION": "1"})
    first = visit(site, "alice")
    first.goto(f"/conversations/{alices.pk}/")
    first.wait_connected()

    second = visit(site, "alice")
    attempts = []
    second.page.on("websocket", lambda socket: attempts.append(socket.url))
    second.page.add_init_script("""window.__closes = [];
        document.addEventListener("htmx:wsClose", evt => window.__closes.push(evt.detail.event.code));""")
    second.goto(f"/conversations/{alices.pk}/")
    note = second.page.locator("#live-closed")
    expect(note).to_contain_text("too many live pages")
    assert note.get_attribute("data-code") == "4429"
    time.sleep(3)  # htmx's ws extension would have retried by now (its first delay is 1 s)
    # No attempt after the 4429. One before it may have been cut off (1006: a handshake
    # that timed out on a busy machine), which the extension rightly retried.
    closes = second.page.evaluate("window.__closes")
    assert closes[-1] == 4429 and len(attempts) == len(closes), (attempts, closes)
    assert set(closes[:-1]) <= {1006}, closes

    # the first page still follows the conversation, and bob's own page opens
    turn = alices.turns.get()
    event = event_record(type="orchestrator.llm_call", turn=turn, summary="still live")
    expect(first.page.locator(f"#event-{event.pk}")).to_contain_text("still live")
    expect(first.page.locator("#live-closed")).to_have_count(0)
    bobs = conversation_for(bob)
    bob_tab = visit(site, "bob")
    bob_tab.goto(f"/conversations/{bobs.pk}/")
    bob_tab.wait_connected()

    # once the first page is gone, a reload of the second one is live again
    first.page.close()
    second.page.reload()
    second.wait_connected()
    expect(second.page.locator("#live-closed")).to_have_count(0)
    assert Event.objects.filter(conversation=alices).count() == 2
