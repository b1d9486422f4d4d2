"""The socket's origin check (assistant/origins.py): scheme, host and port, as Django
checks a POST's Origin. Real daphne and real sockets: tests/browser/test_sockets.py."""

from __future__ import annotations

import pytest

from assistant.origins import origin_allowed


def scope(origin: str | None, host: str = "127.0.0.1:8000", scheme: str = "ws", **headers: str) -> dict:
    pairs = [(b"host", host.encode())] if host else []
    if origin is not None:
        pairs.append((b"origin", origin.encode()))
    pairs += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": pairs}


@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://127.0.0.1:8000", True),
    ("HTTP://127.0.0.1:8000", True),  # schemes and hosts are case-insensitive
    ("http://127.0.0.1:8001", False),  # another service on the same host
    ("http://127.0.0.1", False),  # port 80
    ("https://127.0.0.1:8000", False),  # the https twin of an http site
    ("http://localhost:8000", False),  # an allowed host, but not the one asked for
    ("http://evil.example:8000", False),
    ("null", False),  # a sandboxed frame or a file: page
    ("http://127.0.0.1:99999", False),  # no such port
    ("ws://127.0.0.1:8000", False),
    ("", False),
    (None, False),
])
def test_an_origin_must_be_the_pages_own(origin, allowed):
    assert origin_allowed(scope(origin)) is allowed


def test_default_ports_are_the_same_origin_written_or_not(settings):
    settings.ALLOWED_HOSTS = ["example.com"]
    assert origin_allowed(scope("https://example.com", host="example.com", scheme="wss"))
    assert origin_allowed(scope("https://example.com:443", host="example.com", scheme="wss"))
    assert not origin_allowed(scope("http://example.com", host="example.com", scheme="wss"))
    assert origin_allowed(scope("http://example.com", host="example.com:80", scheme="ws"))


def test_a_host_outside_allowed_hosts_is_refused_even_from_itself(settings):
    settings.ALLOWED_HOSTS = ["example.com"]
    assert not origin_allowed(scope("http://attacker.example:8000", host="attacker.example:8000"))


def test_csrf_trusted_origins_are_trusted_by_scheme_host_and_port(settings):
    settings.ALLOWED_HOSTS = ["internal", ".example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://app.example.com", "https://*.tools.example.com"]
    assert origin_allowed(scope("https://app.example.com", host="internal:8000"))
    assert origin_allowed(scope("https://a.tools.example.com", host="internal:8000"))
    assert not origin_allowed(scope("http://app.example.com", host="internal:8000"))
    assert not origin_allowed(scope("https://app.example.com:8443", host="internal:8000"))
    assert not origin_allowed(scope("https://tools.example.com.evil", host="internal:8000"))


def test_behind_a_trusted_proxy_its_header_says_the_scheme(settings):
    """Only when SECURE_PROXY_SSL_HEADER names the header, as for Django's request.scheme."""
    settings.ALLOWED_HOSTS = ["example.com"]
    forwarded = scope("https://example.com", host="example.com", x_forwarded_proto="https")
    assert not origin_allowed(forwarded)  # no trusted proxy: anyone can send that header
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert origin_allowed(forwarded)
    assert not origin_allowed(scope("http://example.com", host="example.com", x_forwarded_proto="https"))
