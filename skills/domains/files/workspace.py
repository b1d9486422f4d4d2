"""The per-user workspace directory and the only way a skill turns a path into a file.

A path from a model is hostile until proven otherwise: it is checked as text first
(no NUL or control characters, not absolute, no `..`, bounded lengths), then resolved
with every symlink followed, and the *real* path must still lie inside the workspace.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from contextlib import suppress
from pathlib import Path, PurePosixPath

from django.conf import settings

from skills.base import SkillError
from skills.validation import one_line_problem

MAX_NAME_BYTES = 255  # what common file systems allow per name
MAX_PATH_BYTES = 1024
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


def workspace_root(user) -> Path:
    root = Path(settings.SKILLS_WORKSPACE_ROOT) / str(user.pk)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root.resolve()


def resolve(user, path: str, *, directory: bool = False) -> tuple[Path, Path]:
    """(workspace root, real path of `path` inside it) or SkillError saying why not.

    `directory=True` allows the workspace itself ("" or ".") for listing."""
    _check_text(path)
    root = workspace_root(user)
    try:
        target = (root / path).resolve()
    except (RuntimeError, OSError):
        # A loop of links (RuntimeError before Python 3.13, OSError ELOOP since): a plain
        # refusal, not an "unexpected" failure that leaks the server's path to the model
        # and counts against the skill's circuit breaker.
        raise SkillError(f"path {path!r} is a loop of links") from None
    if target != root and not target.is_relative_to(root):
        raise SkillError(f"path {path!r} leads outside your workspace")
    if not directory and (target == root or path.endswith("/")):
        raise SkillError(f"path {path!r} names a directory, not a file")
    return root, target


def workspace_use(root: Path) -> tuple[int, int]:
    """(files and folders, bytes of the files) in the workspace, links not followed."""
    entries = used = 0
    for folder, folders, files in os.walk(root):
        entries += len(folders) + len(files)
        for name in files:
            with suppress(FileNotFoundError):
                used += os.lstat(os.path.join(folder, name)).st_size
    return entries, used


def relative(root: Path, target: Path) -> str:
    return target.relative_to(root).as_posix()


def read_bytes(target: Path, *, shown: str) -> bytes:
    """The file's content, refusing files over SKILLS_MAX_FILE_BYTES before reading them."""
    try:
        # The path was resolved just before; O_NOFOLLOW refuses a link swapped in since.
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SkillError(f"file {shown!r} not found") from None
    except OSError as exc:
        raise SkillError(f"cannot read {shown!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SkillError(f"{shown!r} is a directory, not a file")
        check_size(info.st_size, shown=shown)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        return file.read()


def check_size(size: int, *, shown: str) -> None:
    limit = settings.SKILLS_MAX_FILE_BYTES
    if size > limit:
        raise SkillError(f"{shown!r} would be {size} bytes; the limit is {limit} bytes")


def digest(target: Path, *, shown: str) -> str | None:
    """The SHA-256 of the file's content (of any size), None if there is no file.

    Taken before replacing the file, so a failure says what the caller was doing."""
    try:
        with open(target, "rb", opener=_no_follow) as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SkillError(f"cannot write {shown!r}: {exc.strerror}") from None


def _no_follow(path, flags: int) -> int:
    """The path was resolved just before; O_NOFOLLOW refuses a link swapped in since."""
    return os.open(path, flags | os.O_NOFOLLOW)


def write_atomic(target: Path, data: bytes, *, shown: str) -> None:
    """Write to a temporary file beside the target, then rename it over the target, so a
    reader (or a crash, or a timeout) never sees half a file."""
    check_size(len(data), shown=shown)
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".partial")
    except OSError as exc:
        raise SkillError(f"cannot write {shown!r}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        raise SkillError(f"cannot write {shown!r}: {exc.strerror}") from None
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temporary)


def _check_text(path: str) -> None:
    if "\x00" in path:
        raise SkillError("paths must not contain NUL bytes")
    problem = one_line_problem(path)
    if problem:
        raise SkillError(f"paths must not contain control characters or line breaks ({problem})")
    try:
        encoded = path.encode()
    except UnicodeEncodeError:
        raise SkillError("the path is not valid text") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise SkillError(f"the path is too long (over {MAX_PATH_BYTES} bytes)")
    if PurePosixPath(path).is_absolute() or path.startswith("\\") or _WINDOWS_DRIVE.match(path):
        raise SkillError("absolute paths are not allowed; give a path inside your workspace")
    parts = path.replace("\\", "/").split("/")
    if ".." in parts:
        raise SkillError("'..' is not allowed in paths")
    if any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        raise SkillError(f"a file or folder name is too long (over {MAX_NAME_BYTES} bytes)")
