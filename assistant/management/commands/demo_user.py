"""Create (or refresh) the demo login and print it.

The password is new on every run unless DEMO_PASSWORD (or --password) names one, and
is only ever printed here, so a forgotten demo instance never keeps a guessable
password by default; a fixed one is for whoever wants the same login across runs.
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Create or refresh the demo user (staff, superuser) with a fresh random password, "
            "or the one in --password or DEMO_PASSWORD.")

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", help="Use this password instead of DEMO_PASSWORD or a random one.")

    def handle(self, *args, username: str, password: str | None, **options):
        password = password or os.environ.get("DEMO_PASSWORD") or secrets.token_urlsafe(9)
        user, created = get_user_model().objects.get_or_create(username=username)
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "Created" if created else "Refreshed"
        self.stdout.write(self.style.SUCCESS(f"{verb} the demo login."))
        self.stdout.write(f"  username: {username}\n  password: {password}")
