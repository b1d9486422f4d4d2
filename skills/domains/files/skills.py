"""files.*: list, read, write and append text files in the user's own workspace.

Writing a file is an effect outside the database: a call replayed after its worker died
between replacing the file and committing could append twice. So each write journals
its intent first (skills/journal.py): the file's digest before and after, and the result.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from skills import journal
from skills.quotas import workspace_reserve
from skills.base import Domain, Skill, SkillError
from skills.domains import schema
from skills.domains.files.workspace import (
    check_size,
    digest,
    read_bytes,
    relative,
    resolve,
    write_atomic,
)

MAX_ENTRIES = 200
READ_CHARS_DEFAULT = 10_000
READ_CHARS_MAX = 12_000  # stays under the executor's bound on a tool result
CONTENT_MAX = 1_000_000  # SKILLS_MAX_FILE_BYTES and the argument cap are the real limits


def files_list(user, *, path: str = "") -> dict:
    root, folder = resolve(user, path, directory=True)
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "not found"
        raise SkillError(f"folder {path!r} {problem}")
    entries = sorted(folder.iterdir(), key=lambda entry: entry.name)
    return {
        "path": relative(root, folder),
        "entries": [_entry(entry) for entry in entries[:MAX_ENTRIES]],
        "total": len(entries),
    }


def files_read(user, *, path: str, offset: int = 0, max_chars: int = READ_CHARS_DEFAULT) -> dict:
    root, target = resolve(user, path)
    data = read_bytes(target, shown=path)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SkillError(f"{path!r} is not a UTF-8 text file") from None
    end = offset + max_chars
    return {
        "path": relative(root, target),
        "size_bytes": len(data),
        "content": text[offset:end],
        "offset": offset,
        "next_offset": end if end < len(text) else None,
    }


def files_write(user, *, path: str, content: str) -> dict:
    root, target = resolve(user, path)
    key = journal.call_key()
    earlier = _earlier_run(key, target, shown=path)
    if earlier is not None:
        return earlier
    before = digest(target, shown=path) if key else None
    data = content.encode()
    workspace_reserve(user=user, root=root, target=target, size=len(data), shown=path)
    return _replace(key, root, target, data, before=before, shown=path)


def files_append(user, *, path: str, content: str) -> dict:
    root, target = resolve(user, path)
    key = journal.call_key()
    earlier = _earlier_run(key, target, shown=path)
    if earlier is not None:
        return earlier
    old = read_bytes(target, shown=path) if target.exists() else None
    data = (old or b"") + content.encode()
    workspace_reserve(user=user, root=root, target=target, size=len(data), shown=path)
    return _replace(key, root, target, data, before=_sha256(old), shown=path)


def _earlier_run(key: str | None, target: Path, *, shown: str) -> dict | None:
    """The result an earlier run of this call journaled, if that run replaced the file or
    may have; None if the file is to be written now.

    What the file holds tells how far that run got. What it was to write: the write
    happened, so answer as it would have. What it found: the write did not happen, so
    write now. Anything else: someone changed the file since, and the write may have
    happened; it must not happen twice, so answer as that run would have, unwritten."""
    entry = journal.recall(key) if key else None
    if entry is None:
        return None
    current = digest(target, shown=shown)
    if current == entry["before"] and current != entry["after"]:
        return None
    return entry["result"]


def _replace(key: str | None, root: Path, target: Path, data: bytes, *, before: str | None,
             shown: str) -> dict:
    """Replace the file with `data`. Within a call (`key`), journal first what the file
    holds now (`before`, a digest or None for no file) and will hold, with the result."""
    result = {"path": relative(root, target), "size_bytes": len(data),
              "created": not target.exists()}
    if key is None:
        write_atomic(target, data, shown=shown)
        return result
    check_size(len(data), shown=shown)
    intent = {"path": result["path"], "before": before, "after": _sha256(data), "result": result}
    journal.record(key, intent)
    try:
        write_atomic(target, data, shown=shown)
    except SkillError:
        journal.forget(key)  # not written; the failed call's row answers its replays
        raise
    return result


def _sha256(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _entry(entry) -> dict:
    if entry.is_symlink():
        return {"name": entry.name, "type": "link"}
    if entry.is_dir():
        return {"name": entry.name, "type": "folder"}
    return {"name": entry.name, "type": "file", "size_bytes": entry.stat().st_size}


_PATH = schema.text("Path inside your workspace, e.g. notes/today.md.", max_length=512, one_line=True)
_FILE_PATH = {**_PATH, "minLength": 1}
_CONTENT = schema.text("Text to write (UTF-8).", max_length=CONTENT_MAX)

DOMAIN = Domain(
    name="files",
    description="The user's private workspace folder: list, read, write and append text files.",
    skills=(
        Skill(
            name="files.list",
            description="List a folder of the workspace (default: its top).",
            parameters=schema.params({"path": _PATH}),
            handler=files_list,
            read_only=True,
            outside=lambda arguments, result: [
                f"file names in {arguments.get('path') or 'the workspace'}"] if result.get("entries") else [],
        ),
        Skill(
            name="files.read",
            description="Read a text file, up to max_chars characters from offset; "
            "next_offset says where to continue (null at the end).",
            parameters=schema.params(
                {
                    "path": _FILE_PATH,
                    "offset": schema.integer(
                        "First character to return.", minimum=0, maximum=10**9, default=0
                    ),
                    "max_chars": schema.integer(
                        "At most this many characters.",
                        minimum=1,
                        maximum=READ_CHARS_MAX,
                        default=READ_CHARS_DEFAULT,
                    ),
                },
                required=("path",),
            ),
            handler=files_read,
            read_only=True,
            outside=lambda arguments, result: [f"file {arguments['path']}"],
        ),
        Skill(
            name="files.write",
            description="Create or replace a text file (folders are created as needed).",
            parameters=schema.params(
                {"path": _FILE_PATH, "content": _CONTENT}, required=("path", "content")
            ),
            handler=files_write,
            effect=lambda arguments, result: f"wrote file {arguments['path']}",
        ),
        Skill(
            name="files.append",
            description="Add text to the end of a file, creating it if needed.",
            parameters=schema.params(
                {"path": _FILE_PATH, "content": _CONTENT}, required=("path", "content")
            ),
            handler=files_append,
            effect=lambda arguments, result: f"appended to file {arguments['path']}",
        ),
    ),
)
