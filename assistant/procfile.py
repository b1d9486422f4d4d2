"""`make run`: honcho over the Procfile, stopping the worker the way it drains, and a quiet Ctrl-C.

Three things in honcho 2 (none an option) cut the worker's drain (the runner's
ASSISTANT_RUNNER_DRAIN_SECONDS, orchestration/delivery/runner.py) short and turned a
Ctrl-C into "make: *** Error 130":

- It sends SIGTERM to each process's whole group. A qcluster's own processes die of it
  at once (django-q2's sentinel restores SIGTERM's default action, and its workers
  inherit it), so no runner drains, and the cluster's main process then waits forever on
  one that died holding a lock. Sent to the main process alone, SIGTERM stops the
  sentinel, which stops the workers, whose runners drain.
- It SIGKILLs whatever is left 5 s later (`honcho.manager.KILL_WAIT`).
- It exits 130 after a Ctrl-C, the stop that was asked for.
"""

from __future__ import annotations

import os
import signal
import sys

import honcho.compat
import honcho.manager
from honcho.command import main

# After the drain, the worker hands back what is still in flight (a short transaction
# each) and exits: the time that may take.
HAND_BACK_MARGIN_SECONDS = 10.0
CTRL_C_STATUS = 130  # honcho's exit status after SIGINT (honcho.manager.SIGNALS)


def kill_wait() -> float:
    """Seconds between honcho's SIGTERM and its SIGKILL: the worker's drain, then its hand-backs."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "assistant.settings")
    from django.conf import settings

    return settings.ASSISTANT_RUNNER_DRAIN_SECONDS + HAND_BACK_MARGIN_SECONDS


def terminate_process(self, pid: int) -> None:
    """SIGTERM the Procfile's process only, not its group (the Procfile `exec`s each
    command, so this is the command itself); the SIGKILL after the wait still takes the
    whole group."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended on its own meanwhile


def exit_status(honcho_status: int | str | None) -> int | str | None:
    """A stop by Ctrl-C is a clean end (0); any other status is honcho's (a process that
    failed, e.g. a port already in use)."""
    return 0 if honcho_status == CTRL_C_STATUS else honcho_status


def run(argv: list[str]) -> int | str | None:
    honcho.manager.KILL_WAIT = kill_wait()
    honcho.compat.ProcessManager.terminate = terminate_process
    try:
        main(["start", *argv])
    except SystemExit as stop:
        return exit_status(stop.code)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
