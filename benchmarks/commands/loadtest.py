"""Load: browser-like users over htmx posts and WebSockets against daphne and a qcluster.

Run it on a scratch database (it creates users, conversations and turns): `make load`
does, on PostgreSQL + Redis. See benchmarks/load.py for what a user does.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import connection

from benchmarks.commands import STYLE, Refused, refuse_unfinished_turns, say
from benchmarks.load import LoadConfig, run_load, table

HELP = "Users log in, open conversations, post messages and watch their sockets; report latency and errors."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = LoadConfig()
    parser.add_argument("--users", type=int, default=defaults.users)
    parser.add_argument("--duration", type=float, default=defaults.duration,
                        help="Seconds during which users start turns (turns in flight then finish).")
    parser.add_argument("--latency", type=int, default=defaults.latency_ms, help="LLM latency, ms.")
    parser.add_argument("--workers", type=int, default=settings.Q_WORKERS)
    parser.add_argument("--agents", type=int, default=defaults.agents, help="Sub-agents per turn.")
    parser.add_argument("--turns-per-conversation", type=int, default=defaults.turns_per_conversation)
    parser.add_argument("--ramp", type=float, default=defaults.ramp, help="Seconds over which users start.")
    parser.add_argument("--think", type=float, default=defaults.think, help="Mean seconds between turns.")
    parser.add_argument("--turn-timeout", type=float, default=defaults.turn_timeout)
    parser.add_argument("--hidden", type=_share, default=defaults.hidden,
                        help="Share of turns spent in another tab (0-1): the page hidden from the post on.")
    parser.add_argument("--hidden-seconds", type=float, default=defaults.hidden_seconds,
                        help="How long such a tab stays hidden.")
    parser.add_argument("--debug", action="store_true", help="Run daphne and the workers with DEBUG on.")
    parser.add_argument("--output", default="bench-results/load.json")
    parser.add_argument("--force", action="store_true", help="Run on a database not named *bench* or *load*.")


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise argparse.ArgumentTypeError(f"a share of the turns, from 0 to 1, not {text!r}")
    return share


def run(options: argparse.Namespace) -> None:
    name = Path(str(connection.settings_dict["NAME"])).name
    if "bench" not in name and "load" not in name and not options.force:
        raise Refused(f"Refusing to write load-test data into {name!r}; point DATABASE_URL at a scratch "
                      "database whose name contains 'load' or 'bench' (make load does), or pass --force.")
    refuse_unfinished_turns(name)
    config = LoadConfig(
        users=options.users, duration=options.duration, latency_ms=options.latency,
        workers=options.workers, agents=options.agents,
        turns_per_conversation=options.turns_per_conversation, ramp=options.ramp,
        think=options.think, turn_timeout=options.turn_timeout, debug=options.debug,
        hidden=options.hidden, hidden_seconds=options.hidden_seconds,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="load-"))
    report = run_load(config, log_dir=log_dir, out=say)
    say("")
    say(table(report))
    for sample in report["errors"]["samples"][:10]:
        say(STYLE.WARNING(sample))
    path = Path(options.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    say(STYLE.SUCCESS(f"Wrote {path}"))
    if report["errors"]["total"]:
        raise Refused(f"{report['errors']['total']} errors (see {path})")
