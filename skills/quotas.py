"""Per-user caps on what skills keep: rows per domain and the size of the workspace.

One user must not fill the database or the disk for everyone (issue 18). Each cap is a
setting (SKILLS_MAX_ROWS per domain; SKILLS_WORKSPACE_MAX_ENTRIES and _BYTES). Past a
cap, the write is refused with a SkillError that tells the agent what the cap is; the
user's other calls, and other users, go on as before.

A cap is counted inside the writing transaction (the handler's, skills/executor.py)
holding the owner's capped-write lock (`owner_lock`, which skills/egress.py takes for
the daily mail caps too). Two workers writing for the same user therefore take turns:
the second counts the first one's row or file, and they cannot both take the last slot.
Writers for other users do not wait. (On SQLite the whole database has one writer at a
time, and the executor's transaction writes before its handler runs.)
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.transaction import TransactionManagementError

from skills.base import SkillError
from skills.domains.calendar.models import CalendarEvent
from skills.domains.email.models import OutboxEmail
from skills.domains.files.workspace import workspace_use
from skills.domains.memory.models import Memory
from skills.domains.tasks.models import Task

# domain → (its rows, what they are called in a refusal)
ROWS = {
    "tasks": (Task, "tasks"),
    "calendar": (CalendarEvent, "calendar events"),
    "memory": (Memory, "memories"),
    "email": (OutboxEmail, "sent emails on record"),
}


# The advisory lock space of capped writes: pg_advisory_xact_lock(OWNER_LOCKS, user id).
OWNER_LOCKS = 0x736B6C73  # "skls"


def owner_lock(user) -> None:
    """Hold the owner's capped-write lock until the transaction ends: one capped write
    per owner at a time.

    A PostgreSQL advisory lock, not the owner's user row: the transaction that holds it
    may be held open by a slow handler (email.send's stays open across the send), and
    the engine locks the user's row for its own bookkeeping (a spend period starting:
    orchestration/budgets/spending.py). On the row, each slow send held that up, and
    with it a database thread of the runner, until enough slow sends had every other
    user's steps waiting too. SQLite has one writer at a time: nothing to take there."""
    if not connection.in_atomic_block:
        raise TransactionManagementError("owner_lock is held until the transaction ends: call it inside one.")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [OWNER_LOCKS, user.pk])


def rows_reserve(*, user, domain: str, adding: int = 1) -> None:
    """Refuse `adding` more rows of `domain` for `user` past SKILLS_MAX_ROWS[domain]."""
    model, noun = ROWS[domain]
    cap = settings.SKILLS_MAX_ROWS[domain]
    owner_lock(user)
    held = model.objects.filter(owner=user).count()
    if held + adding > cap:
        raise SkillError(
            f"the cap of {cap} {noun} per user is reached ({held} now); "
            "no more can be added until some are removed"
        )


def workspace_reserve(*, user, root: Path, target: Path, size: int, shown: str) -> None:
    """Refuse writing `size` bytes to `target` if the workspace would then hold more files
    and folders than SKILLS_WORKSPACE_MAX_ENTRIES or more bytes than _MAX_BYTES. Replacing
    a file with one no larger is always allowed."""
    owner_lock(user)
    entries, used = workspace_use(root)
    new_entries = sum(1 for path in (target, *target.parents) if path.is_relative_to(root)
                      and path != root and not path.exists())
    old_size = target.stat().st_size if target.is_file() else 0
    entries_cap = settings.SKILLS_WORKSPACE_MAX_ENTRIES
    bytes_cap = settings.SKILLS_WORKSPACE_MAX_BYTES
    if new_entries and entries + new_entries > entries_cap:
        raise SkillError(
            f"writing {shown!r} would make {entries + new_entries} files and folders in the "
            f"workspace; the cap is {entries_cap} per user (existing files can still be replaced)"
        )
    if size > old_size and used - old_size + size > bytes_cap:
        raise SkillError(
            f"writing {shown!r} would bring the workspace to {used - old_size + size} bytes; "
            f"the cap is {bytes_cap} bytes per user"
        )
