"""`manage.py traces TURN`: the turn's span tree as an OpenTelemetry backend would get it."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from orchestration.models import Turn
from orchestration.reports.trace_picture import trace_svg
from orchestration.reports.traces import span_lines, turn_trace


class Command(BaseCommand):
    help = "Print a turn's span tree (OpenTelemetry GenAI conventions), built from its records."

    def add_arguments(self, parser):
        parser.add_argument("turn", type=int, help="the turn's id")
        parser.add_argument("--json", action="store_true", help="every span with its attributes, as JSON")
        parser.add_argument("--svg", metavar="PATH", help="also draw the tree on the turn's time axis, as SVG")

    def handle(self, *args, turn: int, **options):
        try:
            roots = turn_trace(Turn.objects.get(pk=turn))
        except Turn.DoesNotExist:
            raise CommandError(f"No turn {turn}.") from None
        if options["svg"]:
            Path(options["svg"]).write_text(trace_svg(roots), encoding="utf-8")
        if options["json"]:
            spans = [{"depth": depth, "name": span.name, "kind": span.kind, "start": span.start.isoformat(),
                      "end": span.end.isoformat(), "error.type": span.error or None, "attributes": span.attributes,
                      "key": span.key, "links": span.links}
                     for root in roots for depth, span in root.walk()]
            self.stdout.write(json.dumps(spans, indent=1, default=str))
            return
        for line in span_lines(roots):
            self.stdout.write(line)
