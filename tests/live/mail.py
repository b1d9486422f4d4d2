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
"""

from __future__ import annotations

import os
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
