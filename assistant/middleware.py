"""Per-request middleware: the user's time zone, and a Content-Security-Policy.

CSP (Django 5.2 has none built in): scripts only from our own origin — no inline
script, no eval — so even HTML that slipped past the sanitiser could not run code.
WebSockets to our own host only.
"""

from __future__ import annotations

from django.conf import settings
from django.shortcuts import render
from django.utils import timezone

from orchestration.zones import stored_time_zone

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith("/admin/"):
            # the admin's own pages use inline scripts and styles; it is staff-only
            response.setdefault("Content-Security-Policy", POLICY.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'").replace("style-src 'self'", "style-src 'self' 'unsafe-inline'"))
        else:
            response.setdefault("Content-Security-Policy", POLICY)
        return response


class TimeZoneMiddleware:
    """Pages show (and forms read) times in the logged-in user's zone; without one yet,
    in the server's, and `request.detect_time_zone` asks the page to let the browser
    report it (templates/base.html, static/js/timezone.js). After AuthenticationMiddleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = stored_time_zone(request.user)
        request.detect_time_zone = request.user.is_authenticated and not name
        with timezone.override(name or None):  # None: settings.TIME_ZONE
            return self.get_response(request)


class StyledNotFoundMiddleware:
    """A 404 is the site's own page even with DEBUG on (the demo's default): Django's
    technical 404 page has inline styles the CSP blocks and no way back. The admin keeps
    Django's own."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (settings.DEBUG and response.status_code == 404 and not request.path.startswith("/admin/")
                and response.get("Content-Type", "").startswith("text/html")):
            return render(request, "404.html", status=404)
        return response
