"""Access control swept over every route: strangers get a 404 or a login page, never data
or a change.

The routes are enumerated from the root resolver (tests/web/sweep.py), so a route added
later is swept too; a route with a URL argument the sweep cannot fill fails loudly.

bob (an outsider), staff and a superuser try every route with alice's conversation and
turn; anonymous visitors try every route; alice tries ids that do not exist. Each URL is
sent as a GET, a POST and an htmx POST with the normal test client (CSRF does not stop
them here; tests/web/test_csrf.py covers that), and every row of the project's data is
compared before and after. A route that takes one method only answers the other with
405 before it looks at any id, identically for every id, so a 405 reveals nothing either.

alice's conversation (and a rule and an allow-list entry of hers) is set up twice — with a paused turn (where continue and stop would
act) and idle (where a message would start a turn) — and alice herself reaches every
route with the same URLs, so neither "nothing changed" nor "404" can pass vacuously.
The socket (ws/conversations/<id>/) is swept in tests/web/test_consumer.py.
"""

from __future__ import annotations

import pytest
from django.contrib.contenttypes.models import ContentType
from django.shortcuts import resolve_url
from django.conf import settings
from django.urls import reverse

from orchestration.budgets.limits import Limits
from orchestration.models import Conversation, Event, Message, Turn, TurnPause
from tests.factories import conversation_for, turn_for
from tests.web.sweep import all_routes, approval_ids, approval_ids_missing, changes, snapshot

ROUTES = all_routes()
APP_ROUTES = [route for route in ROUTES if not route.is_admin]
ID_ROUTES = [route for route in APP_ROUTES if route.arguments]
ADMIN_ROUTES = [route for route in ROUTES if route.is_admin]

# Open to anyone; every other route needs a login.
PUBLIC = {"login", "logout", "healthz", "favicon"}
# Staff may read any conversation's audit trail, but not open the conversation or act on it.
STAFF_READABLE = {"conversation_audit", "conversation_export"}

FORM = {"text": "Hello from someone who should not be here"}
REQUESTS = {
    "GET": lambda client, url: client.get(url),
    "POST": lambda client, url: client.post(url, FORM),
    "htmx POST": lambda client, url: client.post(url, FORM, HTTP_HX_REQUEST="true"),
}
NOT_THERE = {404, 405}


def responses(client, url: str) -> dict:
    return {how: send(client, url) for how, send in REQUESTS.items()}


def codes(client, url: str) -> dict[str, int]:
    return {how: response.status_code for how, response in responses(client, url).items()}


def assert_not_found(got: dict[str, int], url: str) -> None:
    assert set(got.values()) <= NOT_THERE and 404 in got.values(), (url, got)


@pytest.fixture(params=["paused", "idle"])
def alices(request, alice) -> dict[str, int]:
    """alice's conversation, turn and more; the URL arguments that name them."""
    conversation = conversation_for(alice, title="Alice's private plans")
    limits = Limits.from_settings().to_json()
    if request.param == "paused":
        turn = turn_for(conversation, status="paused", limits=limits)
        TurnPause.objects.create(turn=turn, limit="turn_max_agents", detail={"message": "8 agents", "used": 8})
    else:
        turn = turn_for(conversation, status="completed", limits=limits)
    Message.objects.create(conversation=conversation, turn=turn, seq=1, role="user", content="My secret plan")
    Event.objects.create(conversation=conversation, turn=turn, type="turn.started", summary="Turn 1 started")
    return {"conversation_id": conversation.pk, "turn_id": turn.pk, **approval_ids(alice)}


@pytest.fixture
def missing(alices) -> dict[str, int]:
    """Ids no row has (the fixture's rows exist first, so these are past them)."""
    return {
        "conversation_id": (Conversation.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1000,
        "turn_id": (Turn.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1000,
        **approval_ids_missing(),
    }


def test_the_sweep_sees_the_routes():
    """A broken walk would sweep nothing and pass: pin what must be there, and the allow
    lists' names, so renaming a route cannot quietly drop it from them."""
    names = {route.name for route in ROUTES}
    assert {
        "conversation_detail", "message_send", "turn_continue", "turn_stop",
        "conversation_audit", "conversation_export", "approval_rule_revoke", "egress_allow_remove",
        "conversation_delete",
    } <= {route.name for route in ID_ROUTES}
    assert PUBLIC | STAFF_READABLE | {"conversation_list", "conversation_create", "approval_rules",
                                      "approval_rule_add", "egress_allow_add"} <= names
    assert "admin:index" in names and len(ADMIN_ROUTES) > 20


@pytest.mark.parametrize("route", APP_ROUTES, ids=str)
def test_every_route_argument_can_be_filled(route):
    assert route.url({"conversation_id": 1, "turn_id": 2, "rule_id": 3, "entry_id": 4}).startswith("/")


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_an_outsider_gets_404_and_changes_nothing(client, bob, alices, missing, route):
    bobs_own = turn_for(conversation_for(bob, title="Bob's"), status="completed")
    client.force_login(bob)
    before = snapshot()

    got = codes(client, route.url(alices))
    assert_not_found(got, route.url(alices))
    # nothing tells alice's ids from ids that do not exist
    assert got == codes(client, route.url(missing))
    if "turn_id" in route.arguments:
        # alice's turn under bob's own conversation, and bob's turn under alice's
        for ids in ({**alices, "conversation_id": bobs_own.conversation_id},
                    {**alices, "turn_id": bobs_own.pk}):
            assert codes(client, route.url(ids)) == got, ids
    assert changes(before, snapshot()) == []


@pytest.mark.parametrize("auditor", ["staff", "superuser"])
@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_staff_read_the_audit_trail_and_nothing_else(request, client, alices, missing, route, auditor):
    """Staff audit any conversation (GET audit page and audit.json); they do not open
    the chat, send, continue or stop in someone else's conversation."""
    client.force_login(request.getfixturevalue(auditor))
    before = snapshot()
    got = codes(client, route.url(alices))
    if route.name in STAFF_READABLE:
        assert got == {"GET": 200, "POST": 405, "htmx POST": 405}
        assert client.get(route.url(missing)).status_code == 404
    else:
        assert_not_found(got, route.url(alices))
    assert changes(before, snapshot()) == []


@pytest.mark.parametrize("route", APP_ROUTES, ids=str)
def test_anonymous_is_sent_to_login_and_changes_nothing(client, alices, missing, route):
    before = snapshot()
    got = responses(client, route.url(alices))
    if route.name in PUBLIC:
        assert all(response.status_code < 500 for response in got.values()), got
    else:
        login = resolve_url(settings.LOGIN_URL)
        for how, response in got.items():
            if response.status_code != 405:
                assert response.status_code == 302 and response.url.startswith(f"{login}?next="), (how, response)
        if route.arguments:
            assert codes(client, route.url(missing)) == {how: r.status_code for how, r in got.items()}
    assert changes(before, snapshot()) == []


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_ids_that_do_not_exist_are_404(alice_client, alices, missing, route):
    before = snapshot()
    beyond_any_integer_column = dict.fromkeys(missing, 2**63)
    for ids in (missing, beyond_any_integer_column):
        assert_not_found(codes(alice_client, route.url(ids)), route.url(ids))
    if "turn_id" in route.arguments:
        ids = {**alices, "turn_id": missing["turn_id"]}
        assert_not_found(codes(alice_client, route.url(ids)), route.url(ids))
    assert changes(before, snapshot()) == []


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_the_owner_reaches_every_route(alice_client, alices, route):
    """The control: the very URLs the others were refused work for alice, so their 404s
    come from the ownership checks, not from a wrongly filled URL."""
    got = codes(alice_client, route.url(alices))
    assert set(got.values()) - NOT_THERE, got
    assert max(got.values()) < 500, got


@pytest.mark.parametrize("visitor", ["bob", "anonymous"])
def test_the_admin_sends_non_staff_to_its_login(request, client, alice, alices, visitor):
    """Every admin route (every registered model's too). Non-staff are redirected before
    any lookup, so one set of ids serves every model."""
    if visitor == "bob":
        client.force_login(request.getfixturevalue("bob"))
    ids = {
        "object_id": alices["conversation_id"],
        "content_type_id": ContentType.objects.get_for_model(Conversation).pk,
        "id": alice.pk,
        "app_label": "orchestration",
        "url": "no/such/page/",
    }
    admin_login, admin_index = reverse("admin:login"), reverse("admin:index")
    before = snapshot()
    wrong = []
    for route in ADMIN_ROUTES:
        url = route.url(ids)
        for how, response in responses(client, url).items():
            if route.name == "admin:login":
                ok = response.status_code == 200  # the form again: no credentials were sent
            elif route.name == "admin:logout":
                ok = response.status_code == 302 and response.url in (admin_index, f"{admin_login}?next={admin_index}")
            else:
                ok = response.status_code == 302 and response.url.startswith(f"{admin_login}?next=")
            if not ok:
                wrong.append((how, url, response.status_code, response.get("Location")))
    assert wrong == []
    assert changes(before, snapshot()) == []
