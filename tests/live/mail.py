"""A file-based mail backend that a test can hold in the middle of a send.

While the file `hold` exists next to the mail directory, a send writes its worker's pid
to `holding` and waits before delivering anything, so the test can SIGKILL that worker
in the middle of `email.send`, before the mail went out.

While `hold-after` exists, the mail goes out and the worker holds (writing `holding`
too) at its next database query: the one that writes the call's result, once the handler
has returned from the send and journaled it (skills/journal.py), before the call
commits. A hold inside the backend would come before the send returned, before the
journal entry: killed there, the replay must send again.

The qcluster subprocess loads it by dotted path (EMAIL_BACKEND=tests.live.mail.HeldFileBackend).

`SlowFileBackend` is a slow mail server instead: each send first leaves a file in
`sending/` next to the mail directory (its name unique, its text the epoch second the
send began), then sleeps SLOW_MAIL_SECONDS (default 10) before it delivers.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from django.core.mail.backends.filebased import EmailBackend
from django.db import connection


class HeldFileBackend(EmailBackend):
    def send_messages(self, email_messages):
        control = Path(self.file_path).parent
        _hold_while(control / "hold")
        sent = super().send_messages(email_messages)
        if (control / "hold-after").exists():
            _hold_at_next_query(control / "hold-after")
        return sent


class SlowFileBackend(EmailBackend):
    def send_messages(self, email_messages):
        sending = Path(self.file_path).parent / "sending"
        sending.mkdir(exist_ok=True)
        name = f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        (sending / f".{name}").write_text(repr(time.time()))
        os.replace(sending / f".{name}", sending / name)  # whole, for a reader
        time.sleep(float(os.environ.get("SLOW_MAIL_SECONDS", "10")))
        return super().send_messages(email_messages)


def sends_begun(mail_dir: Path) -> list[float]:
    """When each send of a SlowFileBackend writing to `mail_dir` began (epoch seconds)."""
    sending = mail_dir.parent / "sending"
    if not sending.exists():
        return []
    return sorted(float(f.read_text()) for f in sending.iterdir() if not f.name.startswith("."))


def _hold_while(flag: Path) -> None:
    if flag.exists():
        (flag.parent / "holding").write_text(str(os.getpid()))
        while flag.exists():
            time.sleep(0.05)


def _hold_at_next_query(flag: Path) -> None:
    """Hold this thread's next query, once. First in the list of wrappers: the skill's
    deadline removes its own wrapper, the last one, when the handler returns."""

    def hold(execute, sql, params, many, context):
        connection.execute_wrappers.remove(hold)
        _hold_while(flag)
        return execute(sql, params, many, context)

    connection.execute_wrappers.insert(0, hold)
