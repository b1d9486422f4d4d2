"""The one way a skill runs: `execute_skill`. Every call leaves one execution row.

Order of a call:
1. idempotency: a finished row with the same scope + tool_call_id is returned as is
   (`replayed=True`); nothing runs again;
2. refusals (skill not granted, unknown, invalid arguments) are answered at once and
   recorded as failed rows, so the audit shows what the agent tried;
3. the skill's circuit breaker may answer "temporarily unavailable";
4. a short transaction commits the running row with `before_run` (the engine's limit
   counters), so the rows those lock are free again before the handler runs: parallel
   agents' skills run at the same time;
5. a second transaction locks the running row, runs the handler (in a savepoint, under
   its deadline) and writes the final status, so a skill's own rows and its execution
   row's result commit together or not at all, and a concurrent delivery of the same
   call waits for that result and replays it.

Handlers never crash the caller: SkillError, timeouts and unexpected exceptions all
become error outcomes. Only `before_run`'s exceptions, the worker's own timeout and
database failures while recording propagate.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from contextvars import ContextVar
from dataclasses import dataclass, replace
from enum import StrEnum

from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from skills.base import Skill, SkillError
from skills.breaker import breaker_admit, breaker_record
from skills.models import ExecutionStatus
from skills.registry import UnknownSkill, get_skill
from skills.timeouts import SkillTimeout, deadline
from skills.validation import (
    MAX_NESTING,
    nested_too_deep,
    payload_size,
    unstorable_text,
    validate_arguments,
)

logger = logging.getLogger(__name__)

MAX_TOOL_CONTENT_CHARS = 16_000
_STORED_PREVIEW_CHARS = 2_000
_SKILL_NAME_CHARS = 100  # AbstractSkillExecution.skill

# The execution whose handler is running in this context: a skill call made from
# inside a handler becomes its child without the handler passing anything along.
_running_execution: ContextVar[models.Model | None] = ContextVar(
    "skills_running_execution", default=None
)


class ErrorKind(StrEnum):
    INVALID_ARGUMENTS = "invalid_arguments"
    NOT_GRANTED = "not_granted"
    UNKNOWN_SKILL = "unknown_skill"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class SkillOutcome:
    """What a call produced, as the engine needs it and as the model will read it."""

    ok: bool
    status: str  # an ExecutionStatus other than running
    data: dict | None = None
    error: str = ""
    error_kind: str = ""  # an ErrorKind when not ok
    problems: tuple[str, ...] = ()  # invalid arguments, one sentence each
    retryable: bool = False  # the same call may succeed later
    execution_id: int | None = None
    replayed: bool = False
    duration_ms: int = 0

    def as_tool_content(self) -> str:
        """Compact JSON for the tool message, at most MAX_TOOL_CONTENT_CHARS long."""
        if self.ok:
            body: dict = {"ok": True, "result": self.data}
        else:
            body = {"ok": False, "error": self.error, "kind": self.error_kind}
            if self.problems:
                body["problems"] = list(self.problems)
            if self.retryable:
                body["retryable"] = True
        text = full = _compact(body)
        keep = MAX_TOOL_CONTENT_CHARS // 2
        while len(text) > MAX_TOOL_CONTENT_CHARS:
            # Cutting JSON breaks it: wrap the beginning in a valid, marked envelope.
            # (Escaping can lengthen the cut text, hence the loop.)
            text = _compact({"ok": self.ok, "truncated": True, "partial": full[:keep]})
            keep //= 2
        return text


def execution_model() -> type[models.Model]:
    """The concrete AbstractSkillExecution named by SKILLS_EXECUTION_MODEL."""
    return apps.get_model(settings.SKILLS_EXECUTION_MODEL)


def execute_skill(
    *,
    name: str,
    arguments: object,
    user,
    tool_call_id: str,
    scope: dict,
    granted: Collection[str] | None = None,
    parent=None,
    before_run: Callable[[], None] | None = None,
) -> SkillOutcome:
    """Run skill `name` for `user`, exactly once per (scope, tool_call_id).

    `scope` holds the execution model's own key fields, e.g. {"dispatch": dispatch}.
    `granted`, when given, is the set of skills the caller may use. `parent` defaults to
    the execution whose handler is making this call, if any.
    """
    model = execution_model()
    key = {**scope, "tool_call_id": tool_call_id}
    existing = model.objects.filter(**key).first()
    if existing is not None and existing.status != ExecutionStatus.RUNNING:
        return _from_row(existing, replayed=True)
    # A running row was opened (and reserved) but has no result: its worker died in the
    # handler, or is in it now. The call runs again on that row, once no run holds it.
    call = _Call(
        model=model,
        key=key,
        stale=existing,
        name=name,
        arguments=arguments,
        parent=parent if parent is not None else _running_execution.get(),
    )
    refusal = _refusal(name=name, arguments=arguments, granted=granted)
    if refusal is not None:
        return call.record(refusal)
    skill = get_skill(name)
    retry_after = breaker_admit(skill=skill.name)
    if retry_after is not None:
        return call.record(
            _failure(
                ErrorKind.UNAVAILABLE,
                f"skill {skill.name} is temporarily unavailable after repeated failures; "
                f"retry after {retry_after} s",
                retryable=True,
            )
        )
    return call.run(skill, user=user, before_run=before_run)


@dataclass(kw_only=True)
class _Call:
    """One call's row: opened (with its reservation), then run and finished."""

    model: type[models.Model]
    key: dict
    stale: models.Model | None
    name: object
    arguments: object
    parent: models.Model | None

    def record(self, outcome: SkillOutcome) -> SkillOutcome:
        """Store a call that was answered without running its handler."""
        started = time.monotonic()
        with transaction.atomic():
            row = self._open()
            if row is None:
                return self._winner()
            return _finish(row, outcome, started)

    def run(self, skill: Skill, *, user, before_run: Callable[[], None] | None) -> SkillOutcome:
        started = time.monotonic()
        row = self.stale or self._open_reserved(before_run)
        with transaction.atomic():
            if not self._claim(row):
                return self._winner()
            outcome, healthy = _call_handler(skill, user=user, arguments=self.arguments, row=row)
            outcome = _finish(row, outcome, started)
        breaker_record(skill=skill.name, healthy=healthy)
        return outcome

    def _open_reserved(self, before_run: Callable[[], None] | None) -> models.Model:
        """The running row with `before_run` (the engine's budgets), committed before the
        handler runs: the budget rows they lock are released at once, not held while
        the handler runs. A committed running row has had its `before_run`: a replay, or
        a concurrent delivery that opened it first, goes straight to the handler."""
        with transaction.atomic():
            row = self._open()
            if row is None:
                return self.model.objects.get(**self.key)
            if before_run is not None:
                before_run()
            return row

    def _claim(self, row: models.Model) -> bool:
        """Lock the running row for this run; False if another run finished it first.

        The lock is held until the result commits, so a second delivery of the same
        call waits here, then finds it finished and replays it: the handler runs once."""
        return bool(self.model.objects.filter(pk=row.pk, status=ExecutionStatus.RUNNING).update(
            status=ExecutionStatus.RUNNING))

    def _open(self) -> models.Model | None:
        """The running row, or None if a concurrent call with the same key got there first."""
        fields = {
            "skill": _printable(str(self.name))[:_SKILL_NAME_CHARS],
            "arguments": _storable(self.arguments),
            "parent": self.parent,
            "status": ExecutionStatus.RUNNING,
        }
        if self.stale is not None:
            # only while still running: a concurrent run may have finished it meanwhile
            if not self.model.objects.filter(pk=self.stale.pk, status=ExecutionStatus.RUNNING).update(**fields):
                return None
            return self.stale
        try:
            with transaction.atomic():
                return self.model.objects.create(**self.key, **fields)
        except IntegrityError:
            return None

    def _winner(self) -> SkillOutcome:
        return _from_row(self.model.objects.get(**self.key), replayed=True)


def _refusal(*, name: object, arguments: object, granted: Collection[str] | None):
    if granted is not None and (not isinstance(name, str) or name not in granted):
        allowed = ", ".join(sorted(granted)) or "none"
        return _failure(
            ErrorKind.NOT_GRANTED,
            f"skill {name!r} is not granted to this agent; granted skills: {allowed}",
        )
    try:
        skill = get_skill(name)
    except UnknownSkill as exc:
        return _failure(ErrorKind.UNKNOWN_SKILL, str(exc))
    problems = validate_arguments(skill, arguments)
    if problems:
        return _failure(
            ErrorKind.INVALID_ARGUMENTS,
            f"invalid arguments for {skill.name}; correct them and call again",
            problems=tuple(problems),
        )
    return None


def _call_handler(skill: Skill, *, user, arguments: dict, row) -> tuple[SkillOutcome, bool]:
    """Run the handler in a savepoint; (outcome, whether the skill itself looked healthy)."""
    token = _running_execution.set(row)
    try:
        with transaction.atomic():
            with deadline(skill.effective_timeout):
                data = skill.handler(user, **arguments)
            _check_result(data)
    except SkillTimeout as exc:
        outcome = _failure(
            ErrorKind.TIMEOUT, f"{skill.name} {exc}", status=ExecutionStatus.TIMEOUT, retryable=True
        )
        return outcome, False
    except SkillError as exc:
        # A permanent error ("task 12 not found") is a correct answer to a bad request.
        return _failure(ErrorKind.FAILED, exc.message, retryable=not exc.permanent), exc.permanent
    except Exception as exc:
        logger.exception("Skill %s failed unexpectedly (execution %s)", skill.name, row.pk)
        message = f"{skill.name} failed unexpectedly: {type(exc).__name__}: {exc}"
        return _failure(ErrorKind.FAILED, message[:500]), False
    finally:
        _running_execution.reset(token)
    return SkillOutcome(ok=True, status=ExecutionStatus.COMPLETED, data=data), True


def _check_result(data: object) -> None:
    """A result must be a JSON object: it is stored, replayed and shown to a model."""
    if not isinstance(data, dict):
        raise TypeError(f"the handler returned {type(data).__name__}, not a dict")
    json.dumps(data)


def _failure(
    kind: ErrorKind,
    error: str,
    *,
    status: str = ExecutionStatus.FAILED,
    problems: tuple[str, ...] = (),
    retryable: bool = False,
) -> SkillOutcome:
    return SkillOutcome(
        ok=False,
        status=status,
        error=error,
        error_kind=kind,
        problems=problems,
        retryable=retryable,
    )


def _finish(row, outcome: SkillOutcome, started: float) -> SkillOutcome:
    """Write the terminal state. A failed row keeps its error details in `result`."""
    duration_ms = int((time.monotonic() - started) * 1000)
    row.status = outcome.status
    row.error = outcome.error
    row.result = (
        outcome.data
        if outcome.ok
        else {
            "error_kind": outcome.error_kind,
            "problems": list(outcome.problems),
            "retryable": outcome.retryable,
        }
    )
    row.finished_at = timezone.now()
    row.duration_ms = duration_ms
    row.save(update_fields=["status", "error", "result", "finished_at", "duration_ms"])
    return replace(outcome, execution_id=row.pk, duration_ms=duration_ms)


def _from_row(row, *, replayed: bool) -> SkillOutcome:
    common = {"execution_id": row.pk, "replayed": replayed, "duration_ms": row.duration_ms or 0}
    if row.status == ExecutionStatus.COMPLETED:
        return SkillOutcome(ok=True, status=row.status, data=row.result, **common)
    details = row.result if isinstance(row.result, dict) else {}
    return SkillOutcome(
        ok=False,
        status=row.status,
        error=row.error,
        error_kind=details.get("error_kind", ErrorKind.FAILED),
        problems=tuple(details.get("problems", ())),
        retryable=bool(details.get("retryable", False)),
        **common,
    )


def _storable(arguments: object) -> object:
    """The arguments as the audit row keeps them: as sent, unless too big or not JSON."""
    if nested_too_deep(arguments):  # even a preview would have to walk them recursively
        return {"unstorable": f"nested more than {MAX_NESTING} levels deep"}
    size = payload_size(arguments)
    if size is None or unstorable_text(arguments):
        return {"unstorable": ascii(arguments)[:_STORED_PREVIEW_CHARS]}
    if size > settings.SKILLS_MAX_ARGUMENT_BYTES:
        return {"oversized_bytes": size, "preview": _compact(arguments)[:_STORED_PREVIEW_CHARS]}
    return arguments


def _printable(text: str) -> str:
    """`text` with what a database column cannot hold (NUL, lone surrogates) escaped."""
    return text.encode(errors="backslashreplace").decode().replace("\x00", "\\x00")


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
