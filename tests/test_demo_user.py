"""`manage.py demo_user` (assistant/management/commands/demo_user.py): `make run` prints a
fresh password each time unless DEMO_PASSWORD fixes one."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def _demo_user(**options) -> str:
    out = StringIO()
    call_command("demo_user", stdout=out, **options)
    return out.getvalue()


def test_a_fresh_password_on_every_run(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    first, second = _demo_user(), _demo_user()
    assert first.split("password: ")[1] != second.split("password: ")[1]


def test_demo_password_fixes_the_password(monkeypatch):
    monkeypatch.setenv("DEMO_PASSWORD", "open sesame")
    assert "password: open sesame" in _demo_user()
    assert "password: open sesame" in _demo_user()
    user = get_user_model().objects.get(username="demo")
    assert user.check_password("open sesame") and user.is_staff and user.is_superuser


def test_the_option_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("DEMO_PASSWORD", "from the environment")
    assert "password: from the option" in _demo_user(password="from the option")
    assert get_user_model().objects.get(username="demo").check_password("from the option")
