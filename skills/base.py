"""The Skill contract: what a skill declares and what its handler may raise.

A handler is a plain function `handler(user, **arguments) -> dict`. It runs only after
its arguments passed the skill's JSON Schema, inside a transaction and under a deadline
(skills/executor.py), always on behalf of one user whose records are the only ones it
may see or change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from jsonschema import Draft202012Validator

_NAME = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")


class SkillError(Exception):
    """An expected failure the agent can read and act on ("task 12 not found").

    `permanent=False` says the same call may succeed later (a mail server that is
    down): the engine may retry it, and it counts towards the skill's circuit breakers.
    A permanent error is the caller's mistake, not the skill's, so it does not
    (skills/breaker.py). Bad input — a date out of range, a header that cannot be
    written — is always a permanent SkillError, never another exception.
    """

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass(frozen=True, kw_only=True, eq=False)
class Skill:
    """One capability. `parameters` is a closed JSON Schema (additionalProperties false)
    with bounds on every string and array, so validation alone keeps payloads small."""

    name: str
    description: str
    parameters: dict
    handler: Callable[..., dict]
    read_only: bool = False
    timeout: float | None = None  # seconds; None: ASSISTANT_LIMITS["skill_timeout_seconds"]
    # Sends something out of the user's records (an email): its default policy is "ask"
    # (settings.ASSISTANT_SKILL_POLICIES) and `recipients(arguments)` go through the
    # owner's egress policy (skills/egress.py).
    recipients: Callable[[dict], list[str]] | None = None
    # What in a result is outside content — text the user did not write (a file's
    # contents, an email body, a memory an agent saved): `outside(arguments, result)`
    # names each piece ("file notes/plan.txt"). The engine fences results that have any
    # as data and asks before side effects they reach (orchestration/questions/approvals.py).
    outside: Callable[[dict, dict], list[str]] | None = None
    # The side effect of a completed call in a line for the owner ("sent “Hi” to
    # bob@example.com"), listed under the turn's answer; None: the skill and arguments.
    effect: Callable[[dict, dict], str] | None = None
    # What an unexpected exception must be to count as an outage of the skill's outside
    # service (skills/breaker.py); any other is a bug, answered but not counted.
    outage_errors: tuple[type[BaseException], ...] = (OSError,)
    # Its effect happens outside our database (another system's tool, skills/mcp/): it
    # cannot roll back with the call's transaction, so a call sent and never answered is
    # in doubt, asked about, not run again blindly (skills/executor.py).
    external: bool = False
    # Its default policy when the settings name none (skills/policy.py); None: the usual.
    policy: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"Skill name {self.name!r} must look like 'domain.action'.")
        Draft202012Validator.check_schema(self.parameters)
        if self.parameters.get("type") != "object" or self.parameters.get(
            "additionalProperties", True
        ):
            raise ValueError(f"{self.name}: parameters must be a closed object schema.")

    @property
    def domain(self) -> str:
        return self.name.rsplit(".", 1)[0]

    @property
    def breaker_key(self) -> str:
        """What its circuit breakers are kept under (skills/breaker.py): the skill, or for
        an outside server's tool the server, whose outage is every tool's."""
        return self.domain if self.external else self.name

    @property
    def in_doubt_when_lost(self) -> bool:
        """A call lost after it was sent cannot be run again blindly: it may have happened."""
        return self.external and not self.read_only

    @property
    def effective_timeout(self) -> float:
        if self.timeout is not None:
            return self.timeout
        return float(settings.ASSISTANT_LIMITS["skill_timeout_seconds"])

    @property
    def sends(self) -> bool:
        return self.recipients is not None

    def outside_in(self, arguments: dict, result: dict | None) -> list[str]:
        """The outside content in a completed call's result (see `outside`)."""
        if self.outside is None or not isinstance(result, dict):
            return []
        return [str(source)[:200] for source in self.outside(arguments, result)]

    def effect_line(self, arguments: dict, result: dict | None) -> str:
        if self.effect is not None and isinstance(result, dict):
            return self.effect(arguments, result)
        shown = ", ".join(f"{key} {str(value)[:60]}" for key, value in (arguments or {}).items())
        return f"{self.name}" + (f" ({shown})" if shown else "")

    def describe(self) -> dict:
        """What an LLM is shown about this skill (get_skill, use_skill)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "read_only": self.read_only,
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class Domain:
    """A group of skills over one kind of record, with the one line `get_skill` shows."""

    name: str
    description: str
    skills: tuple[Skill, ...] = field(default=())
    # Why it cannot be used now (an MCP server that is down); "" when it can.
    unavailable: str = ""

    def __post_init__(self) -> None:
        for skill in self.skills:
            if skill.domain != self.name:
                raise ValueError(f"Skill {skill.name} does not belong to domain {self.name}.")
        names = [skill.name for skill in self.skills]
        if len(set(names)) != len(names):
            raise ValueError(f"Domain {self.name} declares a skill twice.")

    def get(self, name: str) -> Skill | None:
        return next((skill for skill in self.skills if skill.name == name), None)
