"""Export a conversation's whole audit trail."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from orchestration.models import Conversation
from orchestration.reports.audit import conversation_audit_json


class Command(BaseCommand):
    help = "Print a conversation's audit trail (turns, dispatches, skill executions, events)."

    def add_arguments(self, parser):
        parser.add_argument("conversation_id", type=int)
        parser.add_argument("--json", action="store_true", help="JSON (the only format for now).")

    def handle(self, *args, conversation_id, **options):
        conversation = Conversation.objects.select_related("owner").filter(pk=conversation_id).first()
        if conversation is None:
            raise CommandError(f"No conversation {conversation_id}.")
        self.stdout.write(conversation_audit_json(conversation))
