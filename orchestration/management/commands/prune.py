"""Age out finished turns' transcripts, leaving a tombstone (orchestration/reports/retention.py)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from orchestration.models import Conversation
from orchestration.reports.audit import conversation_audit_json
from orchestration.reports.retention import PruneCounts, age_parse, retention_cutoff, turns_prunable, turns_prune


class Command(BaseCommand):
    help = ("Remove finished turns' transcripts (messages, stored LLM responses, skill arguments and "
            "results, events) older than the window, keeping a tombstone with their counts, tokens and cost.")

    def add_arguments(self, parser):
        parser.add_argument("--older-than", metavar="AGE",
                            help="Nd or Nh, e.g. 90d or 36h (default: ASSISTANT_RETENTION_DAYS days).")
        parser.add_argument("--dry-run", action="store_true", help="Print what would go; change nothing.")
        parser.add_argument("--export", metavar="DIR",
                            help="First write each affected conversation's audit JSON (as `manage.py audit --json`) here.")
        parser.add_argument("--batch-size", type=int, default=None,
                            help="Turns per transaction (default: ASSISTANT_PRUNE_BATCH_SIZE).")

    def handle(self, *args, older_than, dry_run, export, batch_size, **options):
        try:
            window = age_parse(older_than) if older_than else None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        batch_size = batch_size or settings.ASSISTANT_PRUNE_BATCH_SIZE
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        export_dir = Path(export) if export else None
        if export_dir and not dry_run:
            export_dir.mkdir(parents=True, exist_ok=True)
        cutoff = retention_cutoff(older_than=window)
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        doing = "Would prune" if dry_run else "Pruned"
        self.stdout.write(f"{'Dry run: ' if dry_run else ''}pruning turns finished before {cutoff.isoformat()}, "
                          f"{batch_size} per batch.")

        total, exported, after, number = PruneCounts(), set(), 0, 0
        while True:
            # Keyset pages (id > the last seen), so a dry run, which changes nothing, moves on too.
            ids = list(turns_prunable(cutoff=cutoff).filter(pk__gt=after).values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            after, number = ids[-1], number + 1
            if export_dir:
                self._export(export_dir, ids, exported, stamp=stamp, dry_run=dry_run)
            report = turns_prune(turn_ids=ids, cutoff=cutoff, dry_run=dry_run)
            total += report
            self.stdout.write(f"batch {number}: {doing.lower()} {report.words()}")
        if not number:
            self.stdout.write("Nothing to prune.")
            return
        self.stdout.write(self.style.SUCCESS(f"{doing} {total.words()}."))

    def _export(self, directory: Path, turn_ids: list[int], exported: set, *, stamp: str, dry_run: bool) -> None:
        """Each conversation of the batch not yet written in this run, before any of it goes."""
        conversations = (Conversation.objects.filter(turns__pk__in=turn_ids).exclude(pk__in=exported)
                         .distinct().select_related("owner").order_by("pk"))
        for conversation in conversations:
            path = directory / f"conversation-{conversation.pk}-audit-{stamp}.json"
            if dry_run:
                self.stdout.write(f"would export {path}")
            else:
                path.write_text(conversation_audit_json(conversation))
                self.stdout.write(f"exported {path}")
            exported.add(conversation.pk)
