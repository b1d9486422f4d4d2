"""CSRF: a POST without the token is refused with 403 and changes nothing, on every route.

Django's CsrfViewMiddleware runs before any view, so every route — including those that
take GET only — must answer a token-less POST with 403; the sweep enumerates them from
the resolver (tests/web/sweep.py) so a new route is covered too. The client is the owner
(the person a forged request would act as), with `enforce_csrf_checks=True`.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from orchestration.budgets.limits import Limits
from orchestration.models import TurnPause
from tests.conftest import PASSWORD
from tests.factories import conversation_for, turn_for
from tests.web.sweep import all_routes, approval_ids, changes, snapshot

APP_ROUTES = [route for route in all_routes() if not route.is_admin]


@pytest.fixture
def ids(alice) -> dict[str, int]:
    """alice's conversation with a paused turn: continue, stop would each change it; her
    rule and allow-list entry: revoke, remove would."""
    conversation = conversation_for(alice, title="Planning")
    turn = turn_for(conversation, status="paused", limits=Limits.from_settings().to_json())
    TurnPause.objects.create(turn=turn, limit="turn_max_agents", detail={"message": "8 agents", "used": 8})
    return {"conversation_id": conversation.pk, "turn_id": turn.pk, **approval_ids(alice)}


@pytest.fixture
def strict(alice) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    return client


def csrf_token(client: Client, url: str) -> str:
    """The token as a page gives it to a form (and to htmx, via hx-headers)."""
    client.get(url)
    return client.cookies["csrftoken"].value


def still_logged_in(client: Client) -> bool:
    return client.get(reverse("conversation_list")).status_code == 200


def test_the_post_routes_are_all_swept():
    names = {route.name for route in APP_ROUTES}
    assert {"message_send", "turn_continue", "turn_stop", "conversation_create", "logout", "login",
            "approval_rule_add", "approval_rule_revoke", "egress_allow_add", "egress_allow_remove"} <= names


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
@pytest.mark.parametrize("route", APP_ROUTES, ids=str)
def test_a_post_without_the_token_is_403_and_changes_nothing(strict, ids, route, htmx):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    before = snapshot()
    response = strict.post(route.url(ids), {"text": "forged", "username": "alice", "password": PASSWORD}, **headers)
    assert response.status_code == 403, response
    assert changes(before, snapshot()) == []
    assert still_logged_in(strict)  # the forged logout did not log alice out


@pytest.mark.parametrize("name", ["message_send", "turn_stop"])
def test_a_wrong_token_is_403_too(strict, ids, name):
    route = next(route for route in APP_ROUTES if route.name == name)
    csrf_token(strict, reverse("conversation_detail", args=[ids["conversation_id"]]))
    before = snapshot()
    response = strict.post(route.url(ids), {"text": "forged", "csrfmiddlewaretoken": "x" * 64},
                           HTTP_HX_REQUEST="true", HTTP_X_CSRFTOKEN="y" * 64)
    assert response.status_code == 403
    assert changes(before, snapshot()) == []


def test_the_right_token_from_another_site_is_403(strict, ids):
    """Even with the token, a POST whose Origin is another site is refused (Django checks
    Origin against the host and CSRF_TRUSTED_ORIGINS)."""
    url = reverse("turn_stop", args=[ids["conversation_id"], ids["turn_id"]])
    token = csrf_token(strict, reverse("conversation_detail", args=[ids["conversation_id"]]))
    before = snapshot()
    response = strict.post(url, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true",
                           HTTP_ORIGIN="https://evil.example")
    assert response.status_code == 403
    assert changes(before, snapshot()) == []


def test_the_token_in_the_htmx_header_is_accepted(strict, ids):
    """The control: the same client with the page's token gets through (so the 403s above
    are CSRF refusals, not something else)."""
    url = reverse("turn_stop", args=[ids["conversation_id"], ids["turn_id"]])
    token = csrf_token(strict, reverse("conversation_detail", args=[ids["conversation_id"]]))
    response = strict.post(url, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert response.status_code == 204
    assert TurnPause.objects.get().decision == "stop"


def test_a_login_without_the_token_is_403_and_logs_nobody_in(alice):
    """Login CSRF: a forged login would put the victim in the attacker's account."""
    client = Client(enforce_csrf_checks=True)
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session
    assert client.get(reverse("conversation_list")).status_code == 302
