"""The login throttle's hooks into django-axes (settings: AXES_*, LOGIN_*).

Forty wrong passwords in sixteen seconds once met no throttle. django-axes counts failed
logins (the site's and the admin's: both authenticate with the request) per username
and address and per address, and refuses the next ones for a cool-off; these hooks say
which address a request comes from, how many failures each count allows, and what a
refused login sees.
"""

from __future__ import annotations

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.db.models import Sum
from django.shortcuts import render
from django.urls import reverse

from assistant.ratelimits import duration_words


def client_ip(request) -> str:
    """The client's address: REMOTE_ADDR, or behind a trusted proxy (TRUSTED_PROXY=1) the
    address that proxy added to X-Forwarded-For, its right-most entry. Entries to its left
    came from the client and could name anyone."""
    if settings.TRUSTED_PROXY:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        if forwarded[-1]:
            return forwarded[-1]
    return request.META.get("REMOTE_ADDR", "")


class LoginThrottle(AxesDatabaseHandler):
    """django-axes' database handler with a limit per address well above the one per
    username and address.

    django-axes holds the largest of its counts against one limit, so the people behind
    one office address (or a VPN, or a school's NAT) locked each other out after five
    typos between them. Here the per-address count is scaled so that it reaches
    LOGIN_FAILURE_LIMIT only at LOGIN_ADDRESS_FAILURE_LIMIT failures: a guesser trying
    many usernames from one address is still stopped, colleagues are not."""

    def get_failures(self, request, credentials=None) -> int:
        per_user, per_address = (
            attempts.aggregate(failures=Sum("failures_since_start"))["failures"] or 0
            for attempts in self.get_user_attempts(request, credentials)  # AXES_LOCKOUT_PARAMETERS' order
        )
        scaled = per_address * settings.AXES_FAILURE_LIMIT // settings.LOGIN_ADDRESS_FAILURE_LIMIT
        return max(per_user, scaled)


def lockout_response(request, original_response=None, credentials=None):
    """The site's own 429 page, with Retry-After: each refused attempt starts the cool-off
    again (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT), so it is the whole cool-off."""
    seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
    on_admin = request.path.startswith("/admin/")
    message = ("Too many failed logins from your address. For safety, logging in from here is "
               f"paused: try again in {duration_words(seconds)}.")
    response = render(request, "429.html", {
        "heading": "Logins paused", "message": message,
        "back_url": request.get_full_path() if on_admin else reverse("login"),
        "back_words": "Back to the login page",
    }, status=settings.AXES_HTTP_RESPONSE_CODE)
    response["Retry-After"] = str(seconds)
    return response
