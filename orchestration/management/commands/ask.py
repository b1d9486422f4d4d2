"""Run one turn from the terminal and print the answer (DESIGN.md §8)."""

from __future__ import annotations

import json
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django_q.conf import Conf

from orchestration.lifecycle.turns import TurnRefused, turn_start
from orchestration.models import Conversation, Event, SkillApproval, Turn, TurnStatus
from orchestration.questions.approvals import StaleAnswer, approval_answer, approval_question
from orchestration.questions.pauses import APPROVAL, AlreadyAnswered, pause_question, turn_continue
from orchestration.reports.audit import turn_audit

FINAL = {TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.STOPPED, TurnStatus.PAUSED}


class Command(BaseCommand):
    help = "Ask the assistant one thing as USER and print its answer."

    def add_arguments(self, parser):
        parser.add_argument("message", nargs="?", default="")
        parser.add_argument("--user", required=True, help="Username of the conversation's owner.")
        parser.add_argument("--conversation", type=int, help="Continue this conversation (default: a new one).")
        answers = parser.add_mutually_exclusive_group()
        answers.add_argument("--continue", dest="resume", action="store_true",
                             help="Answer 'continue' to the paused turn of --conversation.")
        answers.add_argument("--approve", type=int, metavar="ID",
                             help="Approve the call approval ID asks about (a paused turn prints its id).")
        answers.add_argument("--deny", type=int, metavar="ID", help="Deny the call approval ID asks about.")
        parser.add_argument("--sync", action="store_true", help="Run the tasks inline instead of on workers.")
        parser.add_argument("--json", action="store_true", help="Print the turn's audit tree as JSON.")
        parser.add_argument("--timeout", type=float, default=600, help="Seconds to wait for the workers.")

    def handle(self, *args, message, user, conversation, resume, approve, deny, sync, json, timeout, **options):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"No user named {user!r}.")
        if sync:
            Conf.SYNC = True
        try:
            approval_id = approve if approve is not None else deny
            if approval_id is not None:
                turn = self._answer_approval(owner, approval_id, conversation, approve=approve is not None)
            else:
                turn = self._start(owner, message, conversation, resume)
        except StaleAnswer as exc:
            raise CommandError(" ".join(filter(None, [str(exc), _how_to_answer(user, exc.waiting)]))) from None
        except (TurnRefused, AlreadyAnswered) as exc:
            raise CommandError(str(exc)) from None
        with timezone.override(turn.time_zone or None):  # the times it prints: the user's
            turn = self._wait(turn, timeout=timeout, quiet=json)
            audit = turn_audit(turn) if json else None
        if json:
            self.stdout.write(_dumps(audit))
            return
        self.stdout.write(self.style.NOTICE(f"\nconversation {turn.conversation_id}, turn {turn.number}: {turn.status}"))
        if turn.status == TurnStatus.PAUSED:
            asking = SkillApproval.objects.filter(turn=turn, pause__decision="", pause__limit=APPROVAL).first()
            self.stdout.write(_how_to_answer(user, asking) if asking else
                              f"Resume with: manage.py ask --user {user} --conversation {turn.conversation_id} --continue")
        if turn.status == TurnStatus.FAILED:
            raise CommandError(turn.error)

    def _start(self, owner, message, conversation_id, resume) -> Turn:
        if conversation_id:
            conversation = Conversation.objects.filter(pk=conversation_id, owner=owner).first()
            if conversation is None:
                raise CommandError(f"{owner} has no conversation {conversation_id}.")
        elif resume:
            raise CommandError("--continue needs --conversation.")
        else:
            conversation = Conversation.objects.create(owner=owner)
        if resume:
            turn = conversation.turns.order_by("-number").first()
            if turn is None:
                raise CommandError("This conversation has no turn to continue.")
            return turn_continue(turn=turn, user=owner)
        if not message:
            raise CommandError("Say something: manage.py ask --user NAME \"message\".")
        return turn_start(conversation=conversation, text=message)

    def _answer_approval(self, owner, approval_id: int, conversation_id: int | None, *, approve: bool) -> Turn:
        """The owner's answer to approval `approval_id`, the one the paused turn printed:
        to that call only, never to whatever is asked by the time this runs."""
        approvals = SkillApproval.objects.filter(turn__conversation__owner=owner)
        if conversation_id:
            approvals = approvals.filter(turn__conversation_id=conversation_id)
        approval = approvals.filter(pk=approval_id).first()
        if approval is None:
            raise CommandError(f"{owner} has no approval {approval_id}.")
        # No digest: the id names a stored call, the one printed with it.
        approval_answer(turn=approval.turn, user=owner, approval_id=approval.pk, digest=None, approve=approve)
        return Turn.objects.get(pk=approval.turn_id)

    def _wait(self, turn: Turn, *, timeout: float, quiet: bool) -> Turn:
        """Follow the turn until it ends (or pauses): its events on stderr as progress, its
        answer on stdout as it streams, then the rest of it once stored (not with --json)."""
        last_id, printed = 0, _Printed(self.stdout)
        # An event breaks the answer's line only where both show on one terminal: stdout
        # piped to a file gets the answer as it is, with no line breaks of ours in it.
        shared_terminal = self.stdout.isatty() and self.stderr.isatty()
        deadline = time.monotonic() + timeout
        while True:
            turn.refresh_from_db()
            final = turn.status in FINAL
            if final and not quiet:  # the answer's last part before the turn's last events
                printed.show(_answer(turn) + "\n")
            for event in Event.objects.filter(turn=turn, id__gt=last_id).order_by("id"):
                last_id = event.pk
                if not quiet:
                    if shared_terminal:
                        printed.end_line()
                    at = timezone.localtime(event.created_at)
                    self.stderr.write(f"  {at:%H:%M:%S.%f}"[:-3] + f" {event.type:<34} {event.summary}")
            if final:
                return turn
            if not quiet:  # after the events that came before it
                printed.show(turn.answer_draft)
            if time.monotonic() > deadline:
                raise CommandError(f"Gave up waiting after {timeout:.0f}s; is a worker (qcluster) running?")
            time.sleep(0.2)


def _how_to_answer(user: str, approval: SkillApproval | None) -> str:
    if approval is None:
        return ""
    return (f"Answer approval {approval.pk} with: manage.py ask --user {user} --approve {approval.pk} "
            f"(or --deny {approval.pk})")


def _answer(turn: Turn) -> str:
    pause = turn.pauses.filter(decision="").first() if turn.status == TurnStatus.PAUSED else None
    if pause is not None and pause.limit == APPROVAL:
        return approval_question(pause.approval)
    if pause is not None:  # the chat keeps a one-line record; the question is the prompt's
        return pause_question(pause.limit, pause.detail)
    shown = turn.messages.filter(role__in=["assistant", "notice"], tool_calls=[]).exclude(content="").order_by("seq")
    answer = shown.filter(role="assistant").last()
    if answer is None:
        last = shown.last()
        return last.content if last else f"(no answer; the turn is {turn.status})"
    notes = shown.filter(seq__gt=answer.seq).values_list("content", flat=True)  # the engine's, after it
    return "\n\n".join([answer.content, *notes])


class _Printed:
    """The answer on the terminal as it grows: each look prints only what is new. If the
    text does not go on from what is printed (the call was retried), it starts afresh."""

    def __init__(self, out):
        self.out = out
        self.text = ""
        self.line_open = False

    def show(self, text: str) -> None:
        if not text.startswith(self.text):
            self.end_line()
            self.text = ""
        if len(text) > len(self.text):
            self.out.write(text[len(self.text):], ending="")
            self.out.flush()
            self.text = text
            self.line_open = not text.endswith("\n")

    def end_line(self) -> None:
        """Before another line (an event on stderr) goes to the same terminal."""
        if self.line_open:
            self.out.write("")
            self.line_open = False


def _dumps(data) -> str:
    return json.dumps(data, indent=2, default=str)
