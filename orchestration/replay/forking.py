"""Fork: a stored turn's run taken again up to one model answer, changed there, then live.

`fork(turn, at="orchestrator:2", response={...})` starts a new turn, in a conversation of
its own, with the stored turn's message and limits. Every request is answered from the
recording until the one named by `at` (a role — the orchestrator or an agent id — and
its 1-based answer number), which gets `response` instead (an LLMResponse as JSON:
"content", "tool_calls" of {"id", "name", "arguments"}); from then on the model is asked
for real, and skills run for real. Before the fork, a skill call the stored turn made
gets its stored result (nothing is done twice). The new turn keeps its origin
(Turn.forked_from, forked_at), which its audit shows. It runs inline, in this process:
the engine's model and skill lookup are replaced process-wide while it runs.

`fork_request` is the audit page's way in (the owner's): it checks the point and the
answer, makes the new conversation, and queues `fork_task`, which runs the fork as
`manage.py replay --fork` in a process of its own, never inside a worker that runs
other turns; it is ended before django-q2's task timeout would end the worker.
"""

from __future__ import annotations

import json
import subprocess  # nosec B404 - our own manage.py, arguments checked, no shell
import sys
import tempfile
from dataclasses import replace

from django.conf import settings
from django.db import transaction
from django_q.tasks import async_task

from orchestration.llm import LLMResponse, get_provider
from orchestration.models import ACTIVE_TURN_STATUSES, Conversation, Turn
from orchestration.replay.inline import engine_with
from orchestration.replay.recording import answer_for, recorded_results, recording_of

MAX_ANSWER_CHARS = 64_000


class ForkPointUnknown(ValueError):
    pass


def fork_points(turn: Turn) -> list[dict]:
    """Every stored model answer a fork may start from: {"at", "who", "number", "answer"
    (JSON text)}, the orchestrator's first, then each agent's."""
    recording = recording_of(turn)
    roles = [("orchestrator", "the orchestrator", recording.orchestrator)] + [
        (agent, f"agent {agent}", answers) for agent, answers in sorted(recording.agents.items())]
    return [{"at": f"{role}:{n}", "who": who, "number": n, "answer": json.dumps(answer, indent=1, ensure_ascii=False)}
            for role, who, answers in roles for n, answer in enumerate(answers, start=1)]


def fork_request(turn: Turn, *, at: str, answer_text: str) -> Conversation:
    """Check the point and the answer (ForkPointUnknown or ValueError says what is wrong),
    make the fork's conversation, and queue the fork once this commits."""
    if turn.status in ACTIVE_TURN_STATUSES:
        raise ValueError(f"Turn {turn.pk} has not ended: fork an ended turn.")
    fork_point(at, turn)
    if len(answer_text) > MAX_ANSWER_CHARS:
        raise ValueError(f"The answer is {len(answer_text)} characters; at most {MAX_ANSWER_CHARS}.")
    try:
        response = json.loads(answer_text)
        LLMResponse.from_json(response)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f'Not a model answer ({exc}): {{"content": "...", "tool_calls": [...]}}') from None
    conversation = Conversation.objects.create(owner=turn.conversation.owner,
                                               title=f"Fork of turn {turn.pk} at {at}"[:200])
    transaction.on_commit(lambda: async_task("orchestration.replay.forking.fork_task", turn.pk, at, response,
                                             conversation.pk))
    return conversation


class ForkFailed(RuntimeError):
    pass


def fork_task(turn_id: int, at: str, response: dict, conversation_id: int) -> None:
    """The queued fork, in a process of its own (see the module's docstring). If it cannot
    run, its conversation's title says why (the owner is looking at that conversation),
    and the task fails with the reason (the admin's failed tasks)."""
    seconds = max(1, settings.Q_CLUSTER["timeout"] - 30)  # before django-q2 would kill this worker
    with tempfile.NamedTemporaryFile("w", suffix=".json") as answer:
        json.dump(response, answer)
        answer.flush()
        try:
            done = subprocess.run(  # nosec B603 - our own manage.py, no shell, arguments checked by fork_request
                [sys.executable, str(settings.BASE_DIR / "manage.py"), "replay", str(turn_id), "--fork", at,
                 "--response", answer.name, "--into", str(conversation_id)],
                capture_output=True, text=True, timeout=seconds)
        except subprocess.TimeoutExpired:
            reason = f"it took longer than {seconds} seconds"
        else:
            if done.returncode == 0:
                return
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            reason = lines[-1] if lines else f"it ended with status {done.returncode}"
    conversation = Conversation.objects.filter(pk=conversation_id)
    conversation.update(title=f"Fork of turn {turn_id} at {at}: could not run ({reason})"[:200])
    raise ForkFailed(f"fork of turn {turn_id} at {at}: {reason}")


def fork_point(at: str, turn: Turn) -> tuple[str, int]:
    """("the orchestrator" | "agent X", the 0-based answer) from "orchestrator:2" / "X:1"."""
    role, _, number = at.rpartition(":")
    if not role or not number.isdigit() or int(number) < 1:
        raise ForkPointUnknown(f"{at!r}: name a role and an answer, e.g. orchestrator:2 or finder:1")
    recording = recording_of(turn)
    answers = recording.orchestrator if role == "orchestrator" else recording.agents.get(role)
    if answers is None:
        raise ForkPointUnknown(f"turn {turn.pk} has no agent {role!r}; its agents: "
                               f"{', '.join(sorted(recording.agents)) or 'none'}")
    if int(number) > len(answers):
        raise ForkPointUnknown(f"{role} has {len(answers)} stored answers in turn {turn.pk}, not {number}")
    return ("the orchestrator" if role == "orchestrator" else f"agent {role}"), int(number) - 1


class _ForkModel:
    def __init__(self, recording, point: tuple[str, int], response: dict):
        self.recording, self.point, self.response = recording, point, response
        self.forked = False
        self.live = get_provider()

    async def acomplete(self, **kwargs) -> LLMResponse:
        if not self.forked:
            who, step, answer = answer_for(self.recording, kwargs["messages"], kwargs["tools"])
            if (who, step) == self.point:
                self.forked = True
                return LLMResponse.from_json(self.response)
            if answer is not None:
                return LLMResponse.from_json(answer)
        return await self.live.acomplete(**kwargs)


def _skills_until_fork(model: _ForkModel, results: dict, real_get_skill):
    from skills.context import running_call

    def get_skill(name, user=None):
        skill = real_get_skill(name, user)
        live = skill.handler

        def handler(user_, /, **arguments) -> dict:
            row = running_call.get().row
            stored = results.get((row.dispatch.agent_id, row.tool_call_id))
            if not model.forked and stored is not None and stored.status == "completed" \
                    and (stored.skill, stored.arguments) == (name, arguments):
                return stored.result
            return live(user_, **arguments)

        return replace(skill, handler=handler)

    return get_skill


def fork(turn: Turn, *, at: str, response: dict, conversation: Conversation | None = None) -> Turn:
    """The new turn, run from the stored one's answers to `at`, `response` there, then
    live; in `conversation` (an empty one of the owner's), or a new one."""
    from orchestration.lifecycle.turns import turn_start

    point = fork_point(at, turn)
    LLMResponse.from_json(response)  # refused here if it is not a model answer
    recording = recording_of(turn)
    if conversation is None:
        conversation = Conversation.objects.create(owner=turn.conversation.owner,
                                                   title=f"Fork of turn {turn.pk} at {at}"[:200])
    elif conversation.owner_id != turn.conversation.owner_id or conversation.turns.exists():
        raise ValueError(f"conversation {conversation.pk} is not an empty one of the turn's owner")
    model = _ForkModel(recording, point, response)
    from skills import registry

    skills = _skills_until_fork(model, recorded_results(turn.pk), registry.get_skill)
    with engine_with(model, skills, recording.limits):
        new = turn_start(conversation=conversation, text=recording.text)
    Turn.objects.filter(pk=new.pk).update(forked_from=turn, forked_at=at)
    new.refresh_from_db()
    return new
