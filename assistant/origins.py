"""A socket opens only from a page of this very site: same scheme, host and port.

A browser sends the session cookie with a socket opened by any page, so the origin is
what keeps another site's page (or another service on this host, on another port, or
the plain-http twin of an https site) from following the owner's conversation in their
name. channels' AllowedHostsOriginValidator compares the origin's host alone with
ALLOWED_HOSTS: `http://127.0.0.1:9999` passed for a site on port 8000, and `http://`
for an `https://` one. This check is Django's own for a POST (CsrfViewMiddleware): the
Origin must equal the request's scheme and Host header, or be one of
CSRF_TRUSTED_ORIGINS (with their `*.` subdomain patterns), and the Host must be one of
ALLOWED_HOSTS. Anything else is refused before the handshake completes (HTTP 403), as
channels' validator does.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import is_same_domain, split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


class SameOriginValidator:
    """ASGI middleware around the socket routes (assistant/asgi.py)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def _headers(scope) -> dict[str, str]:
    headers = {}
    for name, value in scope.get("headers", []):
        headers.setdefault(name.decode("latin1").lower(), value.decode("latin1"))
    return headers


def site_scheme(scope, headers: dict[str, str]) -> str:
    """http or https, as Django's request.scheme reads it: a trusted proxy's header when
    SECURE_PROXY_SSL_HEADER names one, else the socket's own (wss → https)."""
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, secure_value = proxy_header
        forwarded = headers.get(name.removeprefix("HTTP_").replace("_", "-").lower())
        if forwarded is not None:
            return "https" if forwarded.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def _origin_key(scheme: str, host: str, port: int | None) -> tuple[str, str, int | None]:
    return scheme, host.lower().strip("[]"), port if port is not None else DEFAULT_PORTS.get(scheme)


def _parse(origin: str) -> tuple[str, str, int | None] | None:
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:  # a port out of range or not a number
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return _origin_key(parts.scheme, parts.hostname, port)


def origin_allowed(scope) -> bool:
    headers = _headers(scope)
    origin, host = headers.get("origin"), headers.get("host", "")
    if not origin or not host:
        return False
    domain, port = split_domain_port(host)
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:  # as Django's request.get_host()
        allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
    if not domain or not validate_host(domain, allowed_hosts):
        return False
    parsed = _parse(origin)
    if parsed is None:
        return False
    scheme = site_scheme(scope, headers)
    if parsed == _origin_key(scheme, domain, int(port) if port else None):
        return True
    return any(_trusted(parsed, pattern) for pattern in settings.CSRF_TRUSTED_ORIGINS)


def _trusted(origin: tuple[str, str, int | None], pattern: str) -> bool:
    """A CSRF_TRUSTED_ORIGINS entry: exact, or `https://*.example.com` for subdomains."""
    wildcard = "://*." in pattern
    trusted = _parse(pattern.replace("://*.", "://", 1))
    if trusted is None:
        return False
    scheme, host, port = origin
    if (scheme, port) != (trusted[0], trusted[2]):
        return False
    return is_same_domain(host, "." + trusted[1]) if wildcard else host == trusted[1]
