"""`manage.py replay TURN`: run a stored turn again through the current engine, from its
records only (no model call, no side effect), and report where it diverges.

`--fork ROLE:STEP --response FILE` forks it instead (orchestration/replay/forking.py):
a new turn with its stored answers up to that one, FILE's answer there, then live.

`--as-fixture PATH` writes the turn's recording instead, which the tests' scripted model
server answers from (tests/support/llm_server.py, `Recorded`): a bad turn from
production becomes a regression test."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from orchestration.models import ACTIVE_TURN_STATUSES, Conversation, Turn
from orchestration.replay.forking import fork as fork_turn
from orchestration.replay.recording import recording_of
from orchestration.replay.replaying import replay


class Command(BaseCommand):
    help = "Replay a stored turn with its recorded model answers and skill results; report divergences."

    def add_arguments(self, parser):
        parser.add_argument("turns", type=int, nargs="+", help="the turns' ids")
        parser.add_argument("--keep", action="store_true", help="keep the replay's conversation (for the audit)")
        parser.add_argument("--fork", metavar="ROLE:STEP",
                            help="fork at this model answer: orchestrator:2, or an agent's, finder:1")
        parser.add_argument("--response", metavar="FILE",
                            help="with --fork: the answer to take there, as JSON: "
                                 '{"content": "...", "tool_calls": '
                                 '[{"id": "...", "name": "...", "arguments": "{...}"}]}')
        parser.add_argument("--into", metavar="CONVERSATION", type=int,
                            help="with --fork: run the fork in this empty conversation of the owner's")
        parser.add_argument("--as-fixture", metavar="PATH",
                            help="write the turn's recording (JSON) for the scripted model server, and replay nothing")

    def handle(self, *args, turns: list[int], keep: bool, as_fixture: str | None, fork: str | None,
               response: str | None, into: int | None, **options):
        diverged = 0
        for turn_id in turns:
            try:
                turn = Turn.objects.select_related("conversation__owner").get(pk=turn_id)
            except Turn.DoesNotExist:
                raise CommandError(f"No turn {turn_id}.") from None
            if turn.status in ACTIVE_TURN_STATUSES:
                raise CommandError(f"Turn {turn_id} has not ended ({turn.status}): replay an ended turn.")
            if fork:
                self._fork(turn, fork, response, many=len(turns) > 1, into=into)
                return
            if as_fixture:
                if len(turns) > 1:
                    raise CommandError("--as-fixture writes one turn: name one.")
                Path(as_fixture).write_text(json.dumps(recording_of(turn).to_json(), indent=1, ensure_ascii=False))
                self.stdout.write(f"turn {turn_id}: its recording is in {as_fixture}; a test answers from it with "
                                  f"tests.support.llm_server.Recorded({as_fixture!r})")
                return
            result = replay(turn, keep=keep)
            kept = f", kept as turn {result.replayed.pk}" if keep and result.replayed else ""
            self.stdout.write(f"turn {turn_id}: {result.model_calls} model answers and {result.skill_calls} skill "
                              f"results replayed{kept}: " + ("no divergence" if not result.diverged else
                                                             f"{len(result.divergences)} divergences"))
            for line in result.divergences:
                self.stdout.write(f"  - {line}")
            diverged += result.diverged
        if diverged:
            raise CommandError(f"{diverged} of {len(turns)} turns diverged.", returncode=1)

    def _fork(self, turn: Turn, at: str, response: str | None, *, many: bool, into: int | None) -> None:
        if many or not response:
            raise CommandError("--fork takes one turn and --response FILE.")
        try:
            answer = json.loads(Path(response).read_text())
            conversation = Conversation.objects.get(pk=into) if into is not None else None
            new = fork_turn(turn, at=at, response=answer, conversation=conversation)
        except Conversation.DoesNotExist:
            raise CommandError(f"No conversation {into}.") from None
        except (OSError, ValueError, TypeError) as exc:
            raise CommandError(f"Cannot fork turn {turn.pk}: {exc}") from None
        self.stdout.write(f"turn {turn.pk} forked at {at}: turn {new.pk} ({new.status}) in conversation "
                          f"{new.conversation_id}, \"{new.conversation.title}\"")
