"""Fixtures for the web tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """The sweeps log users in with force_login, hundreds of times: skip the deliberately
    slow hasher for the users they make (logging in with a password is tested in
    tests/test_pages.py, which keeps it)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
