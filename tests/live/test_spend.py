"""Spend caps on a real qcluster: parallel agents on two worker processes race for the
last of a small token allowance, and none overshoots it (issue 18).

Every model call reserves its estimate before it is made (orchestration/budgets/spending.py);
the scripted model reports less than each estimate, so the allowance's row can never
pass the cap unless two reservations both took the same room."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from django.db.models import Sum
from django_q.models import OrmQ

from orchestration.models import AgentDispatch, LLMCall, SpendAllowance, SpendCounter, Turn, TurnPause
from orchestration.questions.pauses import turn_continue
from orchestration.lifecycle.turns import turn_start
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEARCH = ("tasks.search", {"status": "open"})
CAP = 6000
USAGE = (400, 100, 0)  # each reply: 500 tokens, under every call's estimate (its reserve alone is 600)
DONE = ("completed", "failed", "paused", "stopped")


def quiet(turn: Turn) -> bool:
    """Ended or paused, with nothing queued or running."""
    turn.refresh_from_db()
    return (turn.status in DONE and not OrmQ.objects.exists()
            and not AgentDispatch.objects.filter(turn=turn, state="running").exists())


def used(user) -> tuple[int, int, int]:
    """The user's day and month rows, and what their stored calls report."""
    rows = dict(SpendCounter.objects.filter(user=user).values_list("period", "tokens"))
    totals = LLMCall.objects.filter(turn__conversation__owner=user).aggregate(p=Sum("prompt_tokens"),
                                                                             c=Sum("completion_tokens"))
    return rows.get("day", 0), rows.get("month", 0), (totals["p"] or 0) + (totals["c"] or 0)


def test_parallel_agents_do_not_overshoot_a_small_allowance(llm, qcluster, alice, bob, settings):
    settings.ASSISTANT_SPEND = {**settings.ASSISTANT_SPEND, "tokens_per_day": CAP}
    plan = Plan([Agent(f"s{i}", ["tasks.search"], [SEARCH, SEARCH, SEARCH]) for i in range(6)])
    llm.latency = 0.2
    llm.respond = lambda request: replace(plan(request), usage=USAGE)
    # Estimates just above what a call uses (600 for the answer, the prompt counted at 50
    # characters a token), so that many calls fit in the allowance at once and race for it;
    # near the cap a call takes its whole 600 or trips, never a smaller allowance (which
    # the scripted usage, not cut by it, would pass).
    cluster = qcluster(workers=2, env={"SPEND_TOKENS_PER_DAY": str(CAP), "SPEND_COMPLETION_RESERVE_TOKENS": "600",
                                       "SPEND_MIN_COMPLETION_TOKENS": "600", "SPEND_CHARS_PER_TOKEN": "50"})

    turn = turn_start(conversation=conversation_for(alice), text="Six searchers, a small allowance")
    wait_for(lambda: quiet(turn), timeout=120, what=f"turn {turn.pk} to pause and the workers to go idle",
             cluster=cluster)

    assert turn.status == "paused", turn.error
    assert llm.errors == []
    [pause] = TurnPause.objects.filter(turn=turn)
    assert pause.limit == "spend_cap" and pause.detail["period"] == "day"
    day, month, reported = used(alice)
    print(f"\nalice: {reported} tokens used of {CAP} in {LLMCall.objects.filter(turn=turn).count()} calls "
          f"({len(llm.requests)} asked); peak {llm.peak_in_flight} calls in flight")
    # Every reservation settled or given back: the rows hold what the model was asked
    # for, each call once (a call whose answer came after the pause counts, unstored).
    assert day == month == sum(USAGE[:2]) * len(llm.requests) >= reported
    assert day <= CAP
    assert day >= CAP // 2  # it stopped near the cap, not far short of it

    # Bob's allowance is his own: his turn runs on it while alice's waits (and stops at
    # his own cap, the same plan being as hungry).
    asked, started = len(llm.requests), time.monotonic()
    bobs = turn_start(conversation=conversation_for(bob), text="Bob's search")
    wait_for(lambda: quiet(bobs), timeout=120, what=f"bob's turn {bobs.pk}", cluster=cluster)
    bobs_requests = len(llm.requests) - asked
    print(f"bob's turn beside alice's spent allowance: {bobs.status} after {bobs_requests} calls "
          f"in {time.monotonic() - started:.2f}s")
    bob_day, _, _ = used(bob)
    assert bob_day == sum(USAGE[:2]) * bobs_requests >= CAP // 2
    assert used(alice)[0] == day  # untouched by bob's

    # Staff raise alice's allowance: Continue resumes where the turn stopped.
    SpendAllowance.objects.create(user=alice, tokens_per_day=1_000_000)
    turn_continue(turn=turn, user=alice)
    wait_for(lambda: quiet(turn), timeout=120, what=f"turn {turn.pk} to finish", cluster=cluster)
    assert turn.status == "completed", turn.error
    day, month, reported = used(alice)
    assert day == month == sum(USAGE[:2]) * (len(llm.requests) - bobs_requests) >= reported
