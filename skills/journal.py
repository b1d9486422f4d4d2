"""A journal of effects outside the database, one entry per skill call.

A skill call's result commits with its execution row after the handler returns. A
worker that dies in between leaves the row `running`, and the engine replays the call:
the handler runs again on the same row. Its database writes rolled back, but a file it
replaced or a mail it sent did not. So such a handler journals its outside effect under
`skills.context.current_call_key()`, before its transaction commits, and on a replay
reads the entry back to learn how far its earlier run got.

Entries are JSON files under SKILLS_JOURNAL_ROOT, written to a temporary file, fsynced
and renamed into place, so a crash leaves a whole entry or none. The root must be shared
by every worker machine (like the workspaces): a replay may run on another machine.

Once the call's transaction commits (the run that recorded the entry, or a replay that
read it), its execution row answers every replay and the handler never runs again for
that key, so the entry is removed then (`transaction.on_commit`). An entry left behind
(a crash between that commit and the removal, or a timeout after journaling) is
therefore never read again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import suppress
from functools import partial
from pathlib import Path

from django.conf import settings
from django.db import transaction

from skills.context import current_call_key


def call_key() -> str | None:
    """The running call's key (skills/context.py), None outside a call."""
    return current_call_key()


def record(key: str, entry: dict) -> None:
    """Store `entry` for call `key` durably, and drop it once the call's row commits."""
    path = _path(key)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump({"key": key, **entry}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
    _fsync_directory(path.parent)  # the rename itself must survive a crash of the machine
    transaction.on_commit(partial(forget, key))


def recall(key: str) -> dict | None:
    """The entry an earlier run of call `key` recorded, or None; found, it is dropped once
    this run commits, as if this run had recorded it."""
    try:
        text = _path(key).read_text()
    except FileNotFoundError:
        return None
    entry = json.loads(text)
    entry.pop("key", None)
    transaction.on_commit(partial(forget, key))
    return entry


def forget(key: str) -> None:
    with suppress(FileNotFoundError):
        _path(key).unlink()


def _path(key: str) -> Path:
    """A file name any key maps to safely (the key itself is kept inside the entry)."""
    name = hashlib.sha256(key.encode()).hexdigest()
    return Path(settings.SKILLS_JOURNAL_ROOT) / f"{name}.json"


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
