"""Provenance: the outside content a row was written from, named again when it is read.

Outside content is text the user did not write (`Skill.outside`), named by its source
("file notes.txt"). Copied into a task's title or an event's by an agent that had read
it, it is still that text: the engine passes what had reached a caller to
`execute_skill(outside=...)`, the running call keeps it (skills/context.py), the
handlers that write rows stamp it on them (`provenance_stamp`), and the skills that
read such rows back name them as outside content again (`rows_outside`), whoever reads
them and whenever. The owner's own rows (the admin, forms) carry none.
"""

from __future__ import annotations

from django.db import models

from skills.context import current_outside

MAX_OUTSIDE_SOURCES = 20


def merged(*sources: list[str]) -> list[str]:
    """Outside content from several places, each named once, in order, bounded."""
    seen: list[str] = []
    for group in sources:
        for source in group or []:
            if source not in seen:
                seen.append(source)
    return seen[:MAX_OUTSIDE_SOURCES]


def provenance_stamp(row: models.Model) -> None:
    """Add the running call's outside content to `row.provenance`, before the row is
    saved. Merged, never replaced: no later change by an agent clears what it came from."""
    row.provenance = merged(row.provenance, current_outside())


def provenance_data(row: models.Model) -> dict:
    """What a row's data shows of its provenance: `written_from`, when it has any."""
    return {"written_from": list(row.provenance)} if row.provenance else {}


def rows_outside(noun: str, result: dict, *keys: str) -> list[str]:
    """The rows under `keys` of a skill's result (one row's data, or a list of them)
    that were written from outside content, each named with where that came from:
    "task 12 (written from file notes.txt)"."""
    rows: list = []
    for key in keys:
        value = result.get(key)
        rows.extend(value if isinstance(value, list) else [value])
    return [f"{noun} {row['id']} (written from {'; '.join(row['written_from'])})"
            for row in rows if isinstance(row, dict) and row.get("written_from")]
