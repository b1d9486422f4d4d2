"""Error pages: styled like the site, a way back to the conversations, and nothing the
Content-Security-Policy refuses (no inline script or style), so no console error."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory
from django.urls import path, reverse
from django.views import defaults

from assistant import urls as site_urls
from assistant.middleware import POLICY
from tests.factories import conversation_for

BACK = f'<a href="{reverse("conversation_list")}">Back to your conversations</a>'


def inline_code(html: str) -> list[str]:
    """Script without a src, style elements, style attributes, event handlers: what the CSP blocks."""
    return (re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) + re.findall(r"<style\b[^>]*>", html)
            + re.findall(r"\sstyle=", html) + re.findall(r"\son[a-z]+=", html))


def assert_styled(response, status: int, heading: str) -> None:
    html = response.content.decode()
    assert response.status_code == status
    assert f"<h1>{heading}</h1>" in html
    assert "/static/css/app.css" in html and BACK in html
    assert inline_code(html) == []


@pytest.fixture(autouse=True)
def production(settings):
    settings.DEBUG = False  # with DEBUG on, Django shows its technical pages instead


def test_a_missing_page_is_styled_with_a_way_back(alice_client):
    response = alice_client.get("/no/such/page/")
    assert_styled(response, 404, "Page not found")
    assert response["Content-Security-Policy"] == POLICY
    assert "alice" in response.content.decode()  # the site's own header, the user logged in


def test_an_outsiders_404_looks_the_same(client, bob, alice):
    conversation = conversation_for(alice, title="Alice's private plans")
    client.force_login(bob)
    response = client.get(conversation.get_absolute_url())
    assert_styled(response, 404, "Page not found")
    assert "Alice's private plans" not in response.content.decode()


def test_anonymous_visitors_get_the_404_too(client):
    assert_styled(client.get("/no/such/page/"), 404, "Page not found")


def test_a_refused_admin_change_is_styled(client, superuser, alice):
    conversation = conversation_for(alice)
    client.force_login(superuser)
    response = client.post(reverse("admin:orchestration_conversation_change", args=[conversation.pk]), {})
    assert_styled(response, 403, "Not allowed")


def test_a_failed_csrf_check_is_styled(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("conversation_create"))
    assert_styled(response, 403, "This form has expired")
    assert response["Content-Security-Policy"] == POLICY


def test_the_403_handler_renders_for_a_bare_request():
    request = RequestFactory().get("/")
    assert_styled(defaults.permission_denied(request, PermissionDenied()), 403, "Not allowed")


@pytest.mark.parametrize(("handler", "status", "heading"), [
    (defaults.server_error, 500, "Something went wrong"),
    (lambda request: defaults.bad_request(request, ValueError()), 400, "Bad request"),
])
def test_pages_without_a_request_context_need_no_database(handler, status, heading):
    """A 500 may come from the database itself: its page renders with none (this test has
    no database access, so a query would fail it)."""
    assert_styled(handler(RequestFactory().get("/")), status, heading)


def broken(request):
    raise RuntimeError("a bug")


urlpatterns = [path("broken/", broken), *site_urls.urlpatterns]


@pytest.mark.urls(__name__)
def test_a_server_error_is_served_with_the_styled_page(client):
    client.raise_request_exception = False
    response = client.get("/broken/")
    assert_styled(response, 500, "Something went wrong")
    assert response["Content-Security-Policy"] == POLICY


@pytest.mark.parametrize("path", ["/no/such/page/", "/conversations/999999/"])
def test_with_debug_on_the_demo_shows_the_styled_404_too(alice_client, settings, path):
    """`make run` runs with DEBUG on: Django's technical 404 has inline styles the CSP
    blocks and no way back."""
    settings.DEBUG = True
    assert_styled(alice_client.get(path), 404, "Page not found")


def test_the_browsers_favicon_request_finds_an_icon(client):
    """The admin's pages name no icon, so the browser asks for /favicon.ico on each."""
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")
