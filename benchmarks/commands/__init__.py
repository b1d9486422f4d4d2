"""The benchmarks' commands, run as `python -m benchmarks NAME ...` (benchmarks/__main__.py):
one module each, with HELP, add_arguments(parser) and run(options). What they share is here."""

from __future__ import annotations

from django.core.management.color import color_style

STYLE = color_style()  # SUCCESS and WARNING, coloured on a terminal as manage.py's are


class Refused(Exception):
    """The command will not run as asked, or its run found errors: the message goes to
    standard error and the exit status is 1."""


def say(text: str = "", end: str = "\n") -> None:
    print(text, end=end, flush=True)


def refuse_unfinished_turns(name: str) -> None:
    """A turn left running or waiting (a run stopped midway, a script's) would be taken up
    by the qcluster's reaper beside the measured work, and its model calls and CPU counted
    in the figures: refused, with how to start clean."""
    from orchestration.models import WORKING_TURN_STATUSES, Turn

    if unfinished := Turn.objects.filter(status__in=WORKING_TURN_STATUSES).count():
        raise Refused(f"{name!r} holds {unfinished} unfinished turn(s), which the qcluster's reaper would run "
                      "beside the measured work and count in its figures; start from a fresh database "
                      "(make bench and make load make one).")
