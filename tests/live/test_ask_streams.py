"""`manage.py ask` prints the answer as it streams (issue 15): a real qcluster runs the
turn against a scripted model that streams its chunks; `ask` follows the turn."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from tests.live.test_faults import assert_settled
from tests.live.test_qcluster import SEARCH
from tests.support.llm_server import Agent, Plan

ANSWER = " ".join(f"Line {i} of the answer." for i in range(40))


class Terminal(io.StringIO):
    """Stdout that remembers each write, as a terminal would show it at that moment."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


@pytest.mark.django_db(transaction=True)
def test_ask_prints_the_answer_as_it_streams_and_only_once(llm, qcluster, alice):
    llm.respond = Plan([Agent("finder", ["tasks.search"], [SEARCH], report="Two tasks.")], answer=ANSWER,
                       discover=False)
    llm.chunk_interval = 0.02  # ~4 s of streaming; ask looks every 0.2 s
    qcluster(workers=2)
    terminal, progress = Terminal(), io.StringIO()

    call_command("ask", "Find my tasks", user="alice", stdout=terminal, stderr=progress, timeout=60)

    pieces = [w for w in terminal.writes if w.strip() and ANSWER.find(w.strip()) >= 0]
    assert len(pieces) >= 3, terminal.writes  # in several pieces, as it arrived
    assert terminal.getvalue().count(ANSWER) == 1  # the whole answer, exactly once, unbroken by events
    assert "orchestrator.llm_call" in progress.getvalue()  # events go to stderr
    from orchestration.models import Turn

    assert_settled(Turn.objects.get())
    assert llm.errors == []
