"""Spend caps (issue 18): each user's allowance per day and month, every model call
counted before it is made; the turn's cap on agents' model calls; Continues per turn.

Tasks run inline against the scripted server (the real openai SDK over HTTP)."""

from __future__ import annotations

import threading
import zoneinfo
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from assistant.preferences import preferences_time_zone_set
from benchmarks.llm_server import Agent, Plan, Reply, calls, text
from orchestration.models import LLMCall, SpendAllowance, SpendCounter, TurnPause
from orchestration.pauses import CONTINUES_SPENT, pause_question, turn_continue
from orchestration.limits import LimitTripped
from orchestration.llm.base import Usage
from orchestration.spending import CAP_GRANT, call_estimate, periods_of, spend_reserve, spend_settle, spend_use
from orchestration.turns import TurnRefused, turn_stop

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
    day, _ = periods_of(user)
    return SpendCounter.objects.get(user=user, period="day", starts_on=day.starts_on)


def spend_today(user, tokens: int) -> None:
    """`user` has already used `tokens` today (their earlier turns)."""
    day, _ = periods_of(user)
    SpendCounter.objects.create(user=user, period="day", starts_on=day.starts_on, tokens=tokens)


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
        spend_today(alice, 99_500)  # 500 left: less than any call's estimate
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
        words = pause.words
        midnight = periods_of(alice)[0].renews_at
        assert midnight.tzinfo == zoneinfo.ZoneInfo("Pacific/Auckland") and (midnight.hour, midnight.minute) == (0, 0)
        assert words.label == "your daily token allowance"
        assert words.reached.startswith("You have used 99,500 tokens of your 100,000 tokens today: 500 tokens left, "
                                        "not enough for the next model call (about ")
        assert words.reached.endswith(f"Your allowance renews at midnight ({midnight:%a} {midnight.day} "
                                      f"{midnight:%b}, 00:00, Pacific/Auckland).")
        assert words.grant == CAP_GRANT and words.frees_at == ""
        assert "Continue cannot pass this cap" in pause_question(pause.limit, pause.detail)
        notice = paused.messages.filter(role="notice").last().content
        assert notice.startswith("Turn 1 paused. You have used 99,500 tokens")

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
        # Tomorrow: yesterday's use no longer counts.
        SpendCounter.objects.filter(user=alice).update(starts_on=timezone.localdate() - timedelta(days=2))
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
        assert "renews on the first of the month" in pause.words.reached
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
        assert pause.words.label == "your daily spending allowance"
        assert pause.words.reached.startswith("You have used $0.00 of your $0.0001 today: $0.0001 left, ")


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
        assert pause.words.reached == "The agents have made 5 model calls on this turn, the most one turn may make."
        assert pause.words.grant == "Continue allows 5 more model calls for this turn."

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
        assert pause.words.grant == CONTINUES_SPENT
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
        spend_today(alice, 99_900)
        llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
        turn = run_turn()
        assert turn.status == "paused"
        SpendAllowance.objects.create(user=alice, tokens_per_day=10_000_000)
        turn_continue(turn=turn, user=alice)  # no fresh budget: allowed with no Continues left
        turn.refresh_from_db()
        assert turn.status == "completed", turn.error


def test_period_rows_follow_the_users_zone(alice):
    preferences_time_zone_set(user=alice, time_zone="Pacific/Kiritimati")  # UTC+14
    now = timezone.now().replace(hour=11, minute=0)  # 01:00 the next day there
    day, month = periods_of(alice, now)
    assert day.starts_on == (now + timedelta(hours=14)).date()
    assert day.renews_at - timedelta(days=1) <= now + timedelta(hours=14) and month.starts_on.day == 1
    assert spend_use(alice, periods=(day, month))[0].tokens == 0
    assert Decimal(0) == spend_use(alice)[1].cost_usd


def test_racing_reservations_take_exactly_what_fits(alice, spend):
    """Ten threads, each its own database connection, reserve at once from an allowance
    that holds five calls: five get it, five trip, the row holds exactly five."""
    messages = [{"role": "user", "content": "x" * 3000}]
    estimate, _ = call_estimate(model="unpriced", messages=messages, tools=[])
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
