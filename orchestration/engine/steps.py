"""What a step of work can lead to: the loop's only control flow (orchestration/engine/loop.py).

A role's methods return a `Next` (or None: go on); the few exceptions raised deep in the
code (a tripped limit, a lost lease, a failed model call) become one at the loop's edge,
so every way a step can end is written here, and `Work.end` writes each of them once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from orchestration.budgets.limits import LimitTripped


class Kind(enum.Enum):
    AGAIN = "again"  # ask the model again
    DONE = "done"  # the work reached its end: an answer, a report, or a failure
    WAIT = "wait"  # waits for its agents; released, nothing held (the last one wakes it)
    PAUSE = "pause"  # a limit or a question: the turn pauses for its owner
    HAND_BACK = "hand_back"  # this process is ending: back to the queue, nothing spent
    STOP = "stop"  # not ours any more (stopped, cancelled, taken over): write nothing


@dataclass(frozen=True)
class Next:
    kind: Kind
    outcome: str = ""  # DONE: how it ended (DispatchOutcome; for a turn "completed"/"failed")
    result: str = ""  # DONE: the report
    error: str = ""  # DONE: why it failed
    answer: Any = None  # DONE, orchestrator: the answering message
    trip: LimitTripped | None = None  # PAUSE: what tripped

    @property
    def failed(self) -> bool:
        return self.kind is Kind.DONE and bool(self.error)


class StoredElsewhere(Exception):
    """Another delivery stored this step's answer first: reload and replay what is stored."""


AGAIN = Next(Kind.AGAIN)
WAIT = Next(Kind.WAIT)
HAND_BACK = Next(Kind.HAND_BACK)
STOP = Next(Kind.STOP)


def done(outcome: str, result: str = "", error: str = "", answer: Any = None) -> Next:
    return Next(Kind.DONE, outcome=outcome, result=result, error=error, answer=answer)


def pause(trip: LimitTripped) -> Next:
    return Next(Kind.PAUSE, trip=trip)
