"""Spend caps (issue 18): each user's allowance per day and month, every model call
counted before it is made; the turn's cap on agents' model calls; Continues per turn.
Issue 24: a period keeps the zone it started in, so a zone change cannot reset it; and a
call under a cap asks for no more answer than the cap leaves (`max_tokens`).

Tasks run inline against the scripted server (the real openai SDK over HTTP)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import zoneinfo
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assistant.preferences import preferences_time_zone_set
from orchestration.budgets.limits import LimitTripped
from orchestration.budgets.spending import CAP_GRANT, caps_for, prompt_estimate, spend_reserve, spend_settle, spend_use
from orchestration.models import LLMCall, SpendAllowance, SpendCounter, TurnPause
from orchestration.llm import get_provider
from orchestration.llm.base import Usage
from orchestration.questions.pauses import CONTINUES_SPENT, pause_question, pause_words_of, turn_continue
from orchestration.lifecycle.turns import TurnRefused, turn_stop
from tests.factories import spent
from tests.support.llm_server import Agent, Plan, Reply, calls, text

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = ("tasks.search", {"status": "open"})


@pytest.fixture
def spend(settings):
    def set_spend(**values):
        settings.ASSISTANT_SPEND = {**settings.ASSISTANT_SPEND, **values}

    return set_spend


@pytest.fixture
def limits(settings):
    def set_limits(**values):
        settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, **values}

    return set_limits


def is_agent(request: dict) -> bool:
    return "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}


def agent_requests(llm) -> int:
    return sum(1 for request in llm.requests if is_agent(request))


def today_counter(user) -> SpendCounter:
    return SpendCounter.objects.get(user=user, period="day", ends_at__gt=timezone.now())


def used_by_calls(user) -> int:
    totals = LLMCall.objects.filter(turn__conversation__owner=user).aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    return (totals["p"] or 0) + (totals["c"] or 0)


class TestEveryCallCounts:
    def test_orchestrator_and_agents_calls_settle_to_what_they_used(self, llm, run_turn, alice, spend):
        spend(tokens_per_day=1_000_000, tokens_per_month=5_000_000)
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH]), Agent("b", ["tasks.search"], [SEARCH])])
        turn = run_turn()
        assert turn.status == "completed", turn.error
        calls_made = LLMCall.objects.filter(turn=turn)
        assert calls_made.filter(dispatch__isnull=False).count() == 4  # two per agent
        assert calls_made.filter(dispatch__isnull=True).count() == 4  # get_skill, dispatch, results, answer
        day, month = spend_use(alice)
        # Reserved at an estimate before each call, settled to the reported usage after.
        assert day.tokens == month.tokens == used_by_calls(alice) == 8 * 120
        assert turn.agent_llm_calls == 4

    def test_unlimited_by_default_and_still_counted(self, llm, run_turn, alice):
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
        assert run_turn().status == "completed"
        assert today_counter(alice).tokens == used_by_calls(alice) > 0
        assert not any("max_tokens" in request for request in llm.requests)  # no cap: no bound asked

    def test_priced_calls_count_their_cost(self, llm, run_turn, alice, spend, settings):
        settings.ASSISTANT_ORCHESTRATOR_MODEL = settings.ASSISTANT_AGENT_MODEL = "gpt-4o-mini"
        spend(usd_per_day=10)
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
        assert run_turn().status == "completed"
        cost = LLMCall.objects.aggregate(c=Sum("cost_usd"))["c"]
        assert cost > 0 and today_counter(alice).cost_usd == cost


class TestAllowanceSpent:
    @pytest.fixture
    def paused(self, llm, run_turn, alice, spend):
        preferences_time_zone_set(user=alice, time_zone="Pacific/Auckland")
        spend(tokens_per_day=100_000)
        spent(alice, day=99_500)  # 500 left: less than any call's estimate
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
        return run_turn()

    def test_the_turn_pauses_before_the_call(self, paused, llm, alice):
        assert paused.status == "paused"
        assert llm.requests == []  # nothing was asked of the model
        pause = TurnPause.objects.get(turn=paused)
        assert pause.limit == "spend_cap"
        assert pause.detail["period"] == "day" and pause.detail["used"] == 99_500
        assert today_counter(alice).tokens == 99_500  # the refused reservation took nothing

    def test_the_words_say_what_is_left_and_when_it_renews(self, paused, alice):
        pause = TurnPause.objects.get(turn=paused)
        words = pause_words_of(pause)
        midnight = spend_use(alice)[0].period.renews_at
        assert midnight.tzinfo == zoneinfo.ZoneInfo("Pacific/Auckland") and (midnight.hour, midnight.minute) == (0, 0)
        assert words.label == "your daily token allowance"
        assert words.reached.startswith("You have used 99,500 tokens of your 100,000 tokens today: 500 tokens left, "
                                        "not enough for the next model call (about ")
        assert words.reached.endswith(f"Your allowance renews at midnight ({midnight:%a} {midnight.day} "
                                      f"{midnight:%b}, 00:00, Pacific/Auckland).")
        assert words.grant == CAP_GRANT and words.frees_at == ""
        assert "Continue cannot pass this cap" in pause_question(pause.limit, pause.detail)
        notice = paused.messages.filter(role="notice").last().content
        assert notice == "Turn 1 paused on your daily token allowance: waiting for your answer below."

    def test_continue_is_refused_while_the_allowance_is_spent(self, paused, alice):
        with pytest.raises(TurnRefused, match=r"Your daily allowance is still spent: 500 tokens of your 100,000 "
                                              r"tokens left, and the next model call needs about [\d,]+ tokens\. "
                                              r"It renews at midnight \(.*Pacific/Auckland\); Continue works again"):
            turn_continue(turn=paused, user=alice)
        paused.refresh_from_db()
        assert paused.status == "paused" and paused.continuations == 0
        assert TurnPause.objects.get(turn=paused).decision == ""

    def test_continue_page_shows_the_refusal(self, paused, alice_client):
        url = f"/conversations/{paused.conversation_id}/turns/{paused.pk}/continue/"
        page = alice_client.post(url, follow=True)
        assert page.status_code == 200
        assert b"Your daily allowance is still spent" in page.content

    def test_renewal_lets_continue_resume(self, paused, alice, llm):
        # The day (and the month) ended: their use no longer counts.
        SpendCounter.objects.filter(user=alice).update(ends_at=timezone.now())
        turn_continue(turn=paused, user=alice)
        paused.refresh_from_db()
        assert paused.status == "completed", paused.error
        assert paused.continuations == 0  # a renewed allowance grants no fresh turn budget
        assert today_counter(alice).tokens == used_by_calls(alice)

    def test_staff_raising_the_allowance_lets_continue_resume(self, paused, alice):
        SpendAllowance.objects.create(user=alice, tokens_per_day=200_000)
        turn_continue(turn=paused, user=alice)
        paused.refresh_from_db()
        assert paused.status == "completed", paused.error
        assert today_counter(alice).tokens == 99_500 + used_by_calls(alice)

    def test_other_users_are_unaffected(self, paused, run_turn, bob):
        turn = run_turn(user=bob)
        assert turn.status == "completed", turn.error
        assert today_counter(bob).tokens == used_by_calls(bob)

    def test_a_users_own_override_of_no_cap(self, paused, run_turn, alice):
        SpendAllowance.objects.create(user=alice, tokens_per_day=0)  # 0: no cap for this user
        turn_continue(turn=paused, user=alice)
        paused.refresh_from_db()
        assert paused.status == "completed", paused.error


class TestCapReachedMidTurn:
    def test_an_agent_that_spends_the_rest_pauses_the_turn(self, llm, run_turn, alice, spend):
        spend(tokens_per_month=50_000)
        plan = Plan([Agent("big", ["tasks.search"], [SEARCH, SEARCH])])

        def respond(request: dict) -> Reply:
            reply = plan(request)
            first = is_agent(request) and not any(m["role"] == "tool" for m in request["messages"])
            return replace(reply, usage=(49_000, 0, 0)) if first else reply  # its first call is a big one

        llm.respond = respond
        turn = run_turn()
        assert turn.status == "paused"
        pause = TurnPause.objects.get(turn=turn)
        assert pause.limit == "spend_cap" and pause.detail["period"] == "month"
        assert pause.detail["not_started"] == ["big"]  # back in created, to resume where it was
        assert agent_requests(llm) == 1
        # Counted at what the call reported, beyond its estimate: the cap is crossed by
        # that one call's excess only, and nothing more is asked.
        assert spend_use(alice)[1].tokens == used_by_calls(alice)
        assert "renews on the first of the month" in pause_words_of(pause).reached
        with pytest.raises(TurnRefused, match="Your monthly allowance is still spent"):
            turn_continue(turn=turn, user=alice)
        SpendAllowance.objects.create(user=alice, tokens_per_month=500_000)
        turn_continue(turn=turn, user=alice)
        turn.refresh_from_db()
        assert turn.status == "completed", turn.error
        assert agent_requests(llm) == 3  # the stored first step was not asked again

    def test_a_dollar_cap_counts_priced_calls(self, llm, run_turn, alice, spend, settings):
        settings.ASSISTANT_ORCHESTRATOR_MODEL = settings.ASSISTANT_AGENT_MODEL = "gpt-4o-mini"
        spend(usd_per_day=0.0001)  # less than one call's estimate
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
        turn = run_turn()
        assert turn.status == "paused" and llm.requests == []
        pause = TurnPause.objects.get(turn=turn)
        assert pause.detail["kind"] == "usd"
        assert pause_words_of(pause).label == "your daily spending allowance"
        assert pause_words_of(pause).reached.startswith("You have used $0.00 of your $0.0001 today: $0.0001 left, ")


class TestTurnCapOnAgentCalls:
    """A model that never reports (empty replies, or a useless tool call) cannot make
    hundreds of calls in one turn: the turn's cap pauses it with the ordinary continue?."""

    @pytest.fixture(params=["empty", "useless tool call"])
    def useless(self, request, llm, limits):
        limits(turn_max_llm_calls=5)
        plan = Plan([Agent(f"idle{i}", ["tasks.search"]) for i in range(3)])
        reply = text("") if request.param == "empty" else calls(("noop", {}))

        def respond(req: dict) -> Reply:
            return reply if is_agent(req) else plan(req)

        llm.respond = respond
        return llm

    def test_trips_and_pauses_at_the_cap(self, useless, run_turn):
        turn = run_turn()
        assert turn.status == "paused"
        assert turn.agent_llm_calls == 5 and agent_requests(useless) == 5
        pause = TurnPause.objects.get(turn=turn)
        assert pause.limit == "turn_max_llm_calls" and pause.detail["budget_left"]["agent_llm_calls"] == 0
        assert pause_words_of(pause).reached == "The agents have made 5 model calls on this turn, the most one turn may make."
        assert pause_words_of(pause).grant == "Continue allows 5 more model calls for this turn."

    def test_continue_grants_more_and_the_agents_end(self, useless, run_turn, alice):
        turn = run_turn()
        turn_continue(turn=turn, user=alice)
        turn.refresh_from_db()
        # Each agent stops after three useless replies in a row: nine calls in all.
        assert turn.status == "completed", turn.error
        assert agent_requests(useless) == turn.agent_llm_calls == 9
        assert turn.continuations == 1


class TestContinuesPerTurn:
    def test_past_the_bound_only_stop_is_left(self, llm, run_turn, alice, limits):
        limits(turn_max_llm_calls=2, turn_max_continues=1)
        plan = Plan([Agent(f"idle{i}", ["tasks.search"]) for i in range(3)])
        llm.respond = lambda req: text("") if is_agent(req) else plan(req)
        turn = run_turn()
        assert turn.status == "paused"
        turn_continue(turn=turn, user=alice)
        turn.refresh_from_db()
        assert turn.status == "paused" and turn.continuations == 1
        pause = TurnPause.objects.get(turn=turn, decision="")
        assert pause_words_of(pause).grant == CONTINUES_SPENT
        with pytest.raises(TurnRefused, match=r"This turn has been continued 1 time, the most one turn may be "
                                              r"\(1\)\. Stop ends it with what is done"):
            turn_continue(turn=turn, user=alice)
        turn.refresh_from_db()
        assert turn.status == "paused" and agent_requests(llm) == 4
        turn_stop(turn=turn, user=alice)
        turn.refresh_from_db()
        assert turn.status == "stopped"

    def test_approvals_and_renewals_do_not_count(self, llm, run_turn, alice, spend, limits):
        limits(turn_max_continues=0)
        spend(tokens_per_day=100_000)
        spent(alice, day=99_900)
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
        turn = run_turn()
        assert turn.status == "paused"
        SpendAllowance.objects.create(user=alice, tokens_per_day=10_000_000)
        turn_continue(turn=turn, user=alice)  # no fresh budget: allowed with no Continues left
        turn.refresh_from_db()
        assert turn.status == "completed", turn.error


def realistic(plan: Plan, completion: int):
    """`plan`'s replies, each reporting `completion` tokens and a prompt counted as a
    provider counts English (four characters a token: under the estimate's three)."""

    def respond(request: dict) -> Reply:
        prompt = len(json.dumps(request["messages"]) + json.dumps(request.get("tools", []))) // 4
        return replace(plan(request), usage=(prompt, completion, 0))

    return respond


def day_rows(user) -> list[SpendCounter]:
    return list(SpendCounter.objects.filter(user=user, period="day").order_by("ends_at"))


class TestZoneChange:
    """Issue 24, finding 5: spend at 21:47 UTC, switch to Pacific/Kiritimati (where it is
    already tomorrow), press Continue: a new day's row started, and one real day spent
    48,600 tokens against a 20,000 cap. A period keeps the zone it started in."""

    def test_a_zone_change_does_not_reset_the_day(self, llm, run_turn, alice, spend, clock):
        clock("2026-11-25T21:47:00+00:00")  # alice has no zone of her own: UTC's day
        spend(tokens_per_day=20_000)
        agents = [Agent(f"a{i}", ["tasks.search"], [SEARCH, SEARCH]) for i in range(2)]
        llm.respond = realistic(Plan(agents), completion=1500)
        turn = run_turn()
        assert turn.status == "paused" and TurnPause.objects.get(turn=turn).limit == "spend_cap"
        asked = len(llm.requests)

        preferences_time_zone_set(user=alice, time_zone="Pacific/Kiritimati")  # 11:47 on the 26th there
        renewal = r"renews at midnight \(Thu 26 Nov, 00:00, UTC\)"  # the day's own end and zone
        with pytest.raises(TurnRefused, match=rf"Your daily allowance is still spent: .* It {renewal}"):
            turn_continue(turn=turn, user=alice)
        again = run_turn()  # a new turn counts in the same day
        assert again.status == "paused" and len(llm.requests) == asked
        assert re.search(renewal, pause_words_of(TurnPause.objects.get(turn=again)).reached)
        [day] = day_rows(alice)
        assert day.tokens == used_by_calls(alice) <= 20_000  # one real day, one allowance

        clock("2026-11-26T00:00:30+00:00")  # UTC's day is over: the next starts in her zone
        turn_continue(turn=turn, user=alice)
        turn.refresh_from_db()
        assert turn.status == "completed", turn.error
        first, second = day_rows(alice)
        assert (first.time_zone, first.tokens) == ("UTC", day.tokens)
        # From where the UTC day ended to the first Kiritimati midnight 20 hours on: the
        # one ten hours on (the 27th there) would make a short day.
        assert second.time_zone == "Pacific/Kiritimati"
        assert second.ends_at == datetime.fromisoformat("2026-11-28T00:00:00+14:00")
        assert second.tokens == used_by_calls(alice) - first.tokens > 0

    def test_hopping_zones_starts_at_most_about_one_extra_period_a_day(self, alice, spend, clock):
        """Every two hours for three days, a call from the zone where it is just past four
        in the morning (its next midnight is the first 20 hours on: hopping westward for
        the shortest periods there are), then from the easternmost and the westernmost
        zones (a day ahead of each other). Each period starts where the last ended at the
        earliest and lasts 20 hours at least."""
        spend(tokens_per_day=10**9)
        start = clock("2026-11-25T00:30:00+00:00")
        messages = [{"role": "user", "content": "hello"}]
        for hours in range(0, 72, 2):
            now = clock((start + timedelta(hours=hours)).isoformat())
            four_am = (4 - now.hour) % 24 - (24 if (4 - now.hour) % 24 > 14 else 0)  # hours east of UTC
            for zone in (f"Etc/GMT{-four_am:+d}", "Pacific/Kiritimati", "Etc/GMT+12"):
                preferences_time_zone_set(user=alice, time_zone=zone)
                owner = type(alice).objects.get(pk=alice.pk)  # as a new turn reads it
                reservation = spend_reserve(user=owner, model="unpriced", messages=messages, tools=[])
                spend_settle(reservation=reservation, usage=Usage(prompt_tokens=10, completion_tokens=10), cost=None)
        days = day_rows(alice)
        assert len(days) <= 72 // 20 + 1  # UTC alone would have had 3
        assert all(later.ends_at - earlier.ends_at >= timedelta(hours=20) for earlier, later in zip(days, days[1:]))
        assert sum(day.tokens for day in days) == 72 // 2 * 3 * 20


LONG_ANSWER = "All of it, at length. " * 2000  # some 11,000 tokens of text


class TestAllowanceBoundsTheAnswer:
    """Issue 24, finding 6: no max_tokens was sent, so parallel agents finishing long
    answers passed a 20,000-token day by 4,300 tokens. Under a cap each call asks for no
    more answer than the cap leaves, and the provider stops there."""

    def test_agents_long_answers_stay_within_the_day(self, llm, run_turn, alice, spend):
        spend(tokens_per_day=20_000)
        agents = [Agent(f"w{i}", ["tasks.search"], [SEARCH], report=LONG_ANSWER) for i in range(4)]
        llm.respond = realistic(Plan(agents), completion=11_000)
        turn = run_turn()
        # The bound: a call passes the cap only by what its prompt used beyond its
        # estimate, nothing here (the provider counts four characters a token, the
        # estimate three); before, by whole answers.
        assert today_counter(alice).tokens == used_by_calls(alice) <= 20_000
        assert turn.status == "paused" and TurnPause.objects.get(turn=turn).limit == "spend_cap"
        assert llm.errors == []
        # The orchestrator's calls and the agents' alike ask for a bounded answer.
        assert {is_agent(request) for request in llm.requests} == {True, False}
        assert all(0 < request["max_tokens"] <= 4096 for request in llm.requests)
        cut = LLMCall.objects.filter(turn=turn, response__finish_reason="length")
        assert cut.exists() and all(call.completion_tokens <= 4096 for call in cut)

    def test_parallel_calls_finishing_long_answers_stay_within_the_day(self, llm, alice, spend):
        """Eight agents' calls at once, each its own thread and connection, through the
        real SDK, each answered as long as the provider lets it, until the cap trips."""
        spend(tokens_per_day=20_000)
        llm.respond = realistic(lambda request: text(LONG_ANSWER), completion=11_000)
        llm.latency = 0.05
        messages = [{"role": "user", "content": "Tell me everything. " * 50}]
        start = threading.Barrier(8)
        outcomes: list[str] = []

        def agent():
            try:
                start.wait()
                while True:
                    reservation = spend_reserve(user=alice, model="unpriced", messages=messages, tools=[])
                    response = asyncio.run(get_provider().acomplete(
                        model="unpriced", messages=messages, tools=[], max_tokens=reservation.max_tokens))
                    spend_settle(reservation=reservation, usage=response.usage, cost=None)
                    outcomes.append(response.finish_reason)
            except LimitTripped as trip:
                outcomes.append(trip.limit)
            finally:
                connection.close()

        threads = [threading.Thread(target=agent) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # As above: within the cap, the bound being what prompts use beyond their estimate.
        assert today_counter(alice).tokens <= 20_000
        assert llm.errors == [] and llm.peak_in_flight >= 2
        assert outcomes.count("spend_cap") == 8 and outcomes.count("length") >= 2
        reported = sum(request["max_tokens"] + len(json.dumps(request["messages"])) // 4 for request in llm.requests)
        assert today_counter(alice).tokens == reported

    def test_the_answer_gets_what_the_tokens_left_allow(self, alice, spend, settings):
        spend(tokens_per_day=20_000)
        messages = [{"role": "user", "content": "x" * 3000}]
        prompt = prompt_estimate(messages=messages, tools=[])
        spent(alice, day=20_000 - prompt - 700)
        reservation = spend_reserve(user=alice, model="unpriced", messages=messages, tools=[])
        assert reservation.max_tokens == 700 and reservation.tokens == prompt + 700
        assert today_counter(alice).tokens == 20_000

    def test_below_the_floor_the_cap_trips(self, alice, spend):
        spend(tokens_per_day=20_000, min_completion_tokens=256)
        messages = [{"role": "user", "content": "x" * 3000}]
        prompt = prompt_estimate(messages=messages, tools=[])
        spent(alice, day=20_000 - prompt - 255)
        with pytest.raises(LimitTripped) as trip:
            spend_reserve(user=alice, model="unpriced", messages=messages, tools=[])
        assert trip.value.detail["needed"] == prompt + 256
        assert today_counter(alice).tokens == 20_000 - prompt - 255

    def test_a_dollar_cap_bounds_the_answer_at_the_models_output_price(self, alice, spend, settings):
        spend(usd_per_day=0.001)
        messages = [{"role": "user", "content": "x" * 3000}]
        prompt = prompt_estimate(messages=messages, tools=[])
        price = settings.ASSISTANT_MODEL_PRICES["gpt-4o-mini"]  # dollars per million tokens
        left = Decimal("0.001") - Decimal(str(price["input"])) * prompt / 1_000_000
        reservation = spend_reserve(user=alice, model="gpt-4o-mini", messages=messages, tools=[])
        assert reservation.max_tokens == int(left * 1_000_000 / Decimal(str(price["output"]))) < 4096
        one_token = Decimal(str(price["output"])) / 1_000_000
        assert Decimal("0.001") - one_token < reservation.cost_usd == today_counter(alice).cost_usd <= Decimal("0.001")
        # A model with no price counts against no dollar cap: its answer is not bounded.
        assert spend_reserve(user=alice, model="unpriced", messages=messages, tools=[]).max_tokens is None


def test_a_reservation_costs_two_statements(alice, spend):
    """The engine's step has a statement budget: a call's reservation locks and reads the
    current periods in one SELECT and takes its estimate in one UPDATE (plus the
    transaction's own BEGIN and COMMIT); the zone is read only when a period starts."""
    spend(tokens_per_day=10**9)
    messages = [{"role": "user", "content": "hello"}]
    spend_reserve(user=alice, model="unpriced", messages=messages, tools=[])  # the periods' first call
    owner = type(alice).objects.get(pk=alice.pk)  # as the orchestrator reads it, each pass
    caps = caps_for(owner)
    with CaptureQueriesContext(connection) as statements:
        spend_reserve(user=owner, model="unpriced", messages=messages, tools=[], caps=caps)
    sql = [query["sql"] for query in statements.captured_queries if query["sql"] not in ("BEGIN", "COMMIT")
           and not query["sql"].startswith("BEGIN ")]
    assert [statement.split()[0] for statement in sql] == ["SELECT", "UPDATE"], sql
    assert connection.vendor == "sqlite" or "FOR UPDATE" in sql[0]  # SQLite's transactions are IMMEDIATE


def test_a_first_period_starts_at_midnight_in_the_users_zone(alice):
    preferences_time_zone_set(user=alice, time_zone="Pacific/Kiritimati")  # UTC+14
    now = timezone.now().replace(hour=11, minute=0)  # 01:00 the next day there
    day, month = (use.period for use in spend_use(alice, now=now))
    local = timezone.localtime(now, zoneinfo.ZoneInfo("Pacific/Kiritimati"))
    assert day.starts_on == local.date() == (now + timedelta(hours=14)).date()
    assert day.renews_at == local.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    assert (day.time_zone, month.time_zone) == ("Pacific/Kiritimati", "Pacific/Kiritimati")
    assert month.starts_on == local.date().replace(day=1) and month.renews_at.day == 1
    assert spend_use(alice, now=now)[0].tokens == 0
    assert Decimal(0) == spend_use(alice)[1].cost_usd


def test_racing_reservations_take_exactly_what_fits(alice, spend, settings):
    """Ten threads, each its own database connection, reserve at once from an allowance
    that holds five calls: five get it, five trip, the row holds exactly five."""
    messages = [{"role": "user", "content": "x" * 3000}]
    estimate = prompt_estimate(messages=messages, tools=[]) + settings.ASSISTANT_SPEND["completion_reserve_tokens"]
    spend(tokens_per_day=5 * estimate)
    start = threading.Barrier(10)
    outcomes: list[str] = []

    def reserve():
        try:
            start.wait()
            spend_reserve(user=alice, model="unpriced", messages=messages, tools=[])
            outcomes.append("reserved")
        except LimitTripped as trip:
            outcomes.append(trip.limit)
        finally:
            connection.close()

    threads = [threading.Thread(target=reserve) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["reserved"] * 5 + ["spend_cap"] * 5
    assert today_counter(alice).tokens == 5 * estimate


def test_calls_reserving_and_settling_at_once_never_deadlock(alice, spend):
    """Each reservation and each settlement changes the day's and the month's rows in one
    statement; eight threads doing both over and over must neither deadlock (PostgreSQL
    locks a statement's rows in scan order, which each update reshuffles) nor lose a
    token. The allowance is wide: this is about the locks, not the cap."""
    spend(tokens_per_day=10**9, tokens_per_month=10**9)
    messages = [{"role": "user", "content": "x" * 300}]
    rounds, workers = 25, 8
    start = threading.Barrier(workers)
    errors: list[BaseException] = []

    def call_over_and_over():
        try:
            start.wait()
            for _ in range(rounds):
                reservation = spend_reserve(user=alice, model="unpriced", messages=messages, tools=[])
                spend_settle(reservation=reservation, usage=Usage(prompt_tokens=90, completion_tokens=10), cost=None)
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=call_over_and_over) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    used = {row.period: row.tokens for row in SpendCounter.objects.filter(user=alice)}
    assert used == {"day": rounds * workers * 100, "month": rounds * workers * 100}
