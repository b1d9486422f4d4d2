"""files.*: list, read, write and append text files in the user's own workspace."""

from __future__ import annotations

from skills.base import Domain, Skill, SkillError
from skills.domains import schema
from skills.domains.files.workspace import read_bytes, relative, resolve, write_atomic

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
    existed = target.exists()
    data = content.encode()
    write_atomic(target, data, shown=path)
    return {"path": relative(root, target), "size_bytes": len(data), "created": not existed}


def files_append(user, *, path: str, content: str) -> dict:
    root, target = resolve(user, path)
    existed = target.exists()
    data = (read_bytes(target, shown=path) if existed else b"") + content.encode()
    write_atomic(target, data, shown=path)
    return {"path": relative(root, target), "size_bytes": len(data), "created": not existed}


def _entry(entry) -> dict:
    if entry.is_symlink():
        return {"name": entry.name, "type": "link"}
    if entry.is_dir():
        return {"name": entry.name, "type": "folder"}
    return {"name": entry.name, "type": "file", "size_bytes": entry.stat().st_size}


_PATH = schema.text("Path inside your workspace, e.g. notes/today.md.", max_length=512)
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
        ),
        Skill(
            name="files.write",
            description="Create or replace a text file (folders are created as needed).",
            parameters=schema.params(
                {"path": _FILE_PATH, "content": _CONTENT}, required=("path", "content")
            ),
            handler=files_write,
        ),
        Skill(
            name="files.append",
            description="Add text to the end of a file, creating it if needed.",
            parameters=schema.params(
                {"path": _FILE_PATH, "content": _CONTENT}, required=("path", "content")
            ),
            handler=files_append,
        ),
    ),
)
