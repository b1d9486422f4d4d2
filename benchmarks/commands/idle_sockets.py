"""Idle sockets' cost to daphne, e.g. before and after a change:

    git archive COMMIT | tar -x -C /tmp/before
    python -m benchmarks idle_sockets --counts 50,200,600 --code /tmp/before --code .

It creates a user and a few conversations in the configured database (migrated first).
See benchmarks/idle_sockets.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from django.conf import settings
from django.core.management import call_command

from benchmarks.commands import say
from benchmarks.idle_sockets import measure, table

HELP = "Open N idle sockets of one user and report daphne's CPU."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counts", default="50,200,600", help="Socket counts, comma-separated.")
    parser.add_argument("--conversations", type=int, default=10, help="Conversations the sockets spread over.")
    parser.add_argument("--window", type=float, default=10.0, help="Seconds of quiet to measure over.")
    parser.add_argument("--code", action="append", default=[],
                        help="A checkout to run daphne from (repeatable; default: this one).")


def run(options: argparse.Namespace) -> None:
    call_command("migrate", verbosity=0)
    rows = []
    for checkout in options.code or [settings.BASE_DIR]:
        path = Path(checkout).resolve()
        rows += measure(counts=[int(c) for c in options.counts.split(",")], conversations=options.conversations,
                        window=options.window, code=None if path == Path(settings.BASE_DIR).resolve() else path)
    say(table(rows))
