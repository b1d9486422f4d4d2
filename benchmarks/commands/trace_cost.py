"""What OpenTelemetry export costs per model call: the same turns with export off and on.

    python -m benchmarks trace_cost [--turns 10 --rounds 5]

It creates a user and conversations in the configured database (migrated first). See
benchmarks/trace_cost.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from django.core.management import call_command

from benchmarks.commands import say
from benchmarks.trace_cost import measure, table

HELP = "Run the same turns with trace export off and on; report CPU and SQL per model call."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=10, help="Turns per round and mode.")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds (off then on, each).")
    parser.add_argument("--output", help="Write the rows as JSON here too.")


def run(options: argparse.Namespace) -> None:
    call_command("migrate", verbosity=0)
    say(f"trace_cost: {options.rounds} rounds of {options.turns} turns, export off then on")
    rows = measure(options.turns, options.rounds, progress=say)
    say(table(rows))
    say(f"the receiver got {rows[-1]['received']['posts']} posts, {rows[-1]['received']['bytes']} bytes")
    if options.output:
        Path(options.output).write_text(json.dumps(rows, indent=1))
