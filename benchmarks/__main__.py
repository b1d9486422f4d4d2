"""The benchmarks, beside the engine and not a Django app of the site:

    python -m benchmarks bench [--workloads ...]       makespan, hand-offs, CPU, SQL per step; token economy
    python -m benchmarks loadtest [--users N ...]      browser-like users against daphne and a qcluster
    python -m benchmarks idle_sockets [--counts ...]   idle sockets' cost to daphne
    python -m benchmarks trace_cost [--turns N ...]     OpenTelemetry export off and on, per model call

Run from the project's folder (`make bench`, `make load`), with the site's settings and
the database DATABASE_URL names. `python -m benchmarks NAME --help` lists a command's options.
"""

from __future__ import annotations

import argparse
import os
import sys

COMMANDS = ("bench", "loadtest", "idle_sockets", "trace_cost")  # modules of benchmarks/commands/


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; Django must be set up first (the
    commands read settings and models when they are imported)."""
    from importlib import import_module

    from benchmarks.commands import Refused

    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="Measure the engine: one COMMAND, each with its own --help.")
    names = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {}
    for name in COMMANDS:
        commands[name] = command = import_module(f"benchmarks.commands.{name}")
        command.add_arguments(names.add_parser(name, help=command.HELP, description=command.__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter))
    options = parser.parse_args(argv)
    try:
        commands[options.command].run(options)
    except Refused as refused:
        print(f"{options.command}: {refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "assistant.settings")
    import django

    django.setup()
    sys.exit(main())
