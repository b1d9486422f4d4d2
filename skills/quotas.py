"""Per-user caps on what skills keep: rows per domain and the size of the workspace.

One user must not fill the database or the disk for everyone (issue 18). Each cap is a
setting (SKILLS_MAX_ROWS per domain; SKILLS_WORKSPACE_MAX_ENTRIES and _BYTES). Past a
cap, the write is refused with a SkillError that tells the agent what the cap is; the
user's other calls, and other users, go on as before.

A cap is counted inside the writing transaction (the handler's, skills/executor.py)
with the owner's user row locked (SELECT ... FOR UPDATE, as skills/egress.py does for
the daily mail caps). Two workers writing for the same user therefore take turns: the
second counts the first one's row or file, and they cannot both take the last slot.
Writers for other users do not wait. (On SQLite the whole database has one writer at a
time, and the executor's transaction writes before its handler runs.)
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

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


def owner_lock(user) -> None:
    """Hold the owner's row until the transaction ends: one capped write per owner at a time."""
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()


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
