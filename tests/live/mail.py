"""A file-based mail backend that a test can hold in the middle of a send.

While the file `hold` exists next to the mail directory, a send writes its worker's pid
to `holding` and waits before delivering anything, so the test can SIGKILL that worker
in the middle of `email.send`. The qcluster subprocess loads it by dotted path
(EMAIL_BACKEND=tests.live.mail.HeldFileBackend).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.core.mail.backends.filebased import EmailBackend


class HeldFileBackend(EmailBackend):
    def send_messages(self, email_messages):
        control = Path(self.file_path).parent
        if (control / "hold").exists():
            (control / "holding").write_text(str(os.getpid()))
            while (control / "hold").exists():
                time.sleep(0.05)
        return super().send_messages(email_messages)
