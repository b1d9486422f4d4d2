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
