"""Create (or refresh) the demo login and print it.

The password is new on every run and only ever printed here, so a forgotten demo
instance never keeps a guessable password.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or refresh the demo user (staff, superuser) with a fresh random password."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", help="Use this password instead of a random one.")

    def handle(self, *args, username: str, password: str | None, **options):
        password = password or secrets.token_urlsafe(9)
        user, created = get_user_model().objects.get_or_create(username=username)
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "Created" if created else "Refreshed"
        self.stdout.write(self.style.SUCCESS(f"{verb} the demo login."))
        self.stdout.write(f"  username: {username}\n  password: {password}")
