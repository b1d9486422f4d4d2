"""Give a user tasks (some overdue), calendar events and memories to find in a demo.

Idempotent: records are matched by title (or text), so running it again adds nothing.
Dates are relative to today, so a fresh run always has something overdue and upcoming.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from skills.models import CalendarEvent, Memory, Task

TASKS = [  # (title, notes, days from today until due; None: no due date)
    ("Renew passport", "The old one expires next month.", -5),
    ("Pay the electricity bill", "Account number is on the last invoice.", -1),
    ("Book a dentist appointment", "Check-up and cleaning.", 3),
    ("Prepare the quarterly report", "Numbers from finance first.", 7),
    ("Buy a birthday present for Sam", "", None),
]
EVENTS = [  # (title, days from today, hour, minutes, invitees)
    ("Team stand-up", 1, 9, 15, ["team@example.com"]),
    ("Lunch with Sam", 2, 12, 60, ["sam@example.com"]),
    ("Quarterly planning", 4, 14, 90, ["finance@example.com", "sam@example.com"]),
]
MEMORIES = [  # (text, tags)
    ("My dentist is Dr. Rivera at the Elm Street practice.", ["health"]),
    ("Sam's birthday is on the 14th of June; Sam likes jazz records.", ["people", "birthday"]),
    ("I prefer meetings before noon.", ["work", "preferences"]),
    ("The quarterly report goes to finance@example.com.", ["work"]),
]


class Command(BaseCommand):
    help = "Seed a user's demo tasks, calendar events and memories (safe to run twice)."

    def add_arguments(self, parser):
        parser.add_argument("--user", default="demo", help="Username (default: demo).")

    def handle(self, *args, user: str, **options):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"No user {user!r}; create it first (e.g. manage.py demo_user).")
        today = timezone.localdate()
        with transaction.atomic():
            counts = {
                "tasks": self._tasks(owner, today),
                "calendar events": self._events(owner, today),
                "memories": self._memories(owner),
            }
        for kind, (created, existing) in counts.items():
            self.stdout.write(f"{kind}: {created} created, {existing} already there")

    def _tasks(self, owner, today) -> tuple[int, int]:
        return _count(
            Task.objects.get_or_create(
                owner=owner,
                title=title,
                defaults={
                    "notes": notes,
                    "due": None if days is None else today + timedelta(days=days),
                },
            )
            for title, notes, days in TASKS
        )

    def _events(self, owner, today) -> tuple[int, int]:
        def start(days: int, hour: int):
            return timezone.make_aware(datetime.combine(today + timedelta(days=days), time(hour)))

        return _count(
            CalendarEvent.objects.get_or_create(
                owner=owner,
                title=title,
                defaults={
                    "start": start(days, hour),
                    "duration_minutes": minutes,
                    "end": start(days, hour) + timedelta(minutes=minutes),
                    "invitees": invitees,
                },
            )
            for title, days, hour, minutes, invitees in EVENTS
        )

    def _memories(self, owner) -> tuple[int, int]:
        return _count(
            Memory.objects.get_or_create(owner=owner, text=text, defaults={"tags": tags})
            for text, tags in MEMORIES
        )


def _count(results) -> tuple[int, int]:
    """(created, already there) from get_or_create results."""
    flags = [created for _record, created in results]
    return sum(flags), len(flags) - sum(flags)
