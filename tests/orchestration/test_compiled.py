"""Statements compiled once per process (orchestration/records/compiled.py): each read
gives what its queryset would, for whichever ids it is given, converted as Django
converts rows (JSON, times, booleans, decimals), and each update changes what the
queryset's update would, on both databases, without building it again."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models import Count, F, Q, Sum
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from orchestration.models import AgentDispatch, Event, LLMCall, Turn
from orchestration.records.compiled import CompiledRead, CompiledUpdate, related_attnames
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db


def events_of(turn_id):
    return Event.objects.filter(turn_id=turn_id).order_by("id").values_list(
        "id", "type", "dispatch_id", "payload", "created_at", "payload__skill")


@pytest.fixture
def two_turns(alice):
    conversation = conversation_for(alice)
    turns = [turn_for(conversation, status="completed"), turn_for(conversation)]
    for n, turn in enumerate(turns):
        agent = dispatch_for(turn, f"agent-{n}", depends_on=["x"] * n)
        for i in range(n + 2):
            Event.objects.create(conversation=conversation, turn=turn, dispatch=agent if i else None,
                                 type="skill.started", payload={"skill": f"s{n}.{i}", "nested": {"n": [i, None]}})
        LLMCall.objects.create(turn=turn, dispatch=agent, key=f"k{n}", model="gpt-4o-mini", prompt_tokens=10 * (n + 1),
                               completion_tokens=n, cost_usd=None if n else Decimal("0.0125"))
    return turns


def test_each_call_gives_the_querysets_rows_for_its_own_ids(two_turns):
    built = []
    read = CompiledRead(lambda turn_id: built.append(turn_id) or events_of(turn_id))

    for turn in two_turns * 2:
        assert read(turn.pk) == list(events_of(turn.pk))
    assert read(-1) == []
    assert len(built) == 1  # built and compiled once, whatever the ids

    payload, created = read(two_turns[1].pk)[1][3], read(two_turns[1].pk)[1][4]
    assert payload == {"skill": "s1.1", "nested": {"n": [1, None]}}  # JSON, not its text
    assert created.tzinfo is not None


def test_values_with_annotations_come_back_as_values_gives_them(two_turns):
    def spend(conversation_id, turn_id):
        return LLMCall.objects.filter(turn__conversation_id=conversation_id).order_by().values("turn_id", "model").annotate(
            n=Count("id"), tokens=Sum("prompt_tokens"), cost=Sum("cost_usd"),
            in_turn=Count("id", filter=Q(turn_id=turn_id)), unpriced=Count("id", filter=Q(cost_usd__isnull=True)))

    read = CompiledRead(spend, arity=2)
    conversation_id = two_turns[0].conversation_id
    for turn in two_turns:
        got = sorted(read.dicts(conversation_id, turn.pk), key=lambda row: row["turn_id"])
        assert got == sorted(spend(conversation_id, turn.pk), key=lambda row: row["turn_id"])
        assert [row["in_turn"] for row in got] == [int(row["turn_id"] == turn.pk) for row in got]
    assert isinstance(read.dicts(conversation_id, two_turns[0].pk)[0]["cost"], Decimal)


def test_instances_hold_what_only_would_and_defer_the_rest(two_turns):
    fields = ("turn_id", "agent_id", "state", "depends_on", "created_at")
    read = CompiledRead(lambda turn_id: AgentDispatch.objects.filter(turn_id=turn_id).values_list("id", *fields))

    for turn in two_turns:
        [got] = read.instances(AgentDispatch, turn.pk)
        [want] = AgentDispatch.objects.filter(turn_id=turn.pk).only(*fields)
        assert got.pk == want.pk and not got._state.adding
        assert {name: getattr(got, name) for name in fields} == {name: getattr(want, name) for name in fields}
        assert got.get_deferred_fields() == want.get_deferred_fields()


def test_an_id_that_never_reaches_the_sql_is_refused_when_built(two_turns):
    read = CompiledRead(lambda turn_id, unused: Event.objects.filter(turn_id=turn_id).values_list("id"), arity=2)

    with pytest.raises(ValueError, match=r"ids \[1\] are not parameters"):
        read(two_turns[0].pk, 5)
    with pytest.raises(TypeError):
        read(two_turns[0].pk)


def test_a_positive_integer_varies_too(two_turns):
    """A turn's number is a PositiveIntegerField: PostgreSQL's compiler passes it typed
    (psycopg's Int4), and each call's number goes in that way."""
    def up_to(conversation_id, number):
        return Event.objects.filter(conversation_id=conversation_id, turn__number__lte=number).values_list("id")

    read = CompiledRead(up_to, arity=2)
    conversation_id = two_turns[0].conversation_id
    for number in (0, 1, 2):
        assert sorted(read(conversation_id, number)) == sorted(up_to(conversation_id, number))


def test_an_id_compared_with_a_time_is_prepared_as_the_column_keeps_it(two_turns):
    """SQLite keeps times as text in its own format, PostgreSQL as timestamps: a value
    compared with a time column goes in as the ORM's own filter would pass it."""
    turn = two_turns[1]
    created = list(Event.objects.filter(turn=turn).order_by("id").values_list("created_at", flat=True))
    read = CompiledRead(lambda turn_id, until: Event.objects.filter(turn_id=turn_id, created_at__lte=until)
                        .order_by("id").values_list("id"), arity=2)

    for until in created:
        assert read(turn.pk, until) == list(Event.objects.filter(turn=turn, created_at__lte=until)
                                           .order_by("id").values_list("id"))
    assert len(read(turn.pk, created[-1])) == len(created)


def test_instances_carry_the_related_rows_they_read(two_turns, django_assert_num_queries):
    read = CompiledRead(lambda turn_id: AgentDispatch.objects.filter(turn_id=turn_id).values_list(
        "id", "agent_id", "profile_id", *related_attnames(AgentDispatch, "turn__conversation"),
        *related_attnames(AgentDispatch, "turn"), *related_attnames(AgentDispatch, "profile")))

    with django_assert_num_queries(1):
        [got] = read.instances(AgentDispatch, two_turns[0].pk)
        assert got.turn.conversation.owner_id == two_turns[0].conversation.owner_id
        assert got.turn.number == two_turns[0].number and got.turn.limits == two_turns[0].limits
        assert got.profile is None  # a nullable key with no row: None, as select_related gives it


@pytest.mark.django_db(transaction=True)  # no transaction around the test: the read's own check
def test_a_locking_read_runs_only_inside_a_transaction(two_turns):
    read = CompiledRead(lambda turn_id: Turn.objects.select_for_update(no_key=True, of=("self",))
                        .filter(pk=turn_id).values_list("id"))
    with transaction.atomic():
        assert read(two_turns[0].pk) == [(two_turns[0].pk,)]
    with pytest.raises(TransactionManagementError):
        read(two_turns[0].pk)  # compiled already, and still refused, as the queryset is


def test_an_update_changes_what_the_querysets_update_would(two_turns):
    """Each call's values go where its build put them, prepared as their columns are
    (text, JSON, a time, NULL); it changes only the rows that match, and says how many."""
    release = CompiledUpdate(lambda p: (
        AgentDispatch.objects.filter(pk=p.pk, lease_token=p.token, state__in=["running", "created"]),
        {"lease_token": p.new_token, "awaiting": p.awaiting, "finished_at": p.at, "result": p.result}))
    agents = [turn.dispatches.get() for turn in two_turns]
    AgentDispatch.objects.filter(pk=agents[0].pk).update(lease_token="mine", state="running")
    at = timezone.now()

    assert release(pk=agents[0].pk, token="someone else's", new_token="", awaiting={}, at=at, result="no") == 0
    assert release(pk=agents[0].pk, token="mine", new_token="next", awaiting={"agent_ids": ["b", "ç"]}, at=at,
                   result="it's done — 100%") == 1
    assert release(pk=agents[0].pk, token="next", new_token="", awaiting={}, at=None, result="again") == 1

    first, other = (AgentDispatch.objects.get(pk=agent.pk) for agent in agents)
    assert (first.lease_token, first.awaiting, first.finished_at, first.result) == ("", {}, None, "again")
    assert other.result == agents[1].result  # not touched
    assert release(pk=agents[0].pk, token="", new_token="", awaiting={"n": [1]}, at=at, result="x") == 1
    assert AgentDispatch.objects.get(pk=agents[0].pk).finished_at == at
    assert AgentDispatch.objects.get(pk=agents[0].pk).awaiting == {"n": [1]}


def test_an_update_adds_to_counters(two_turns):
    add = CompiledUpdate(lambda p: (Turn.objects.filter(pk=p.pk), {"prompt_tokens": F("prompt_tokens") + p.tokens}))
    for tokens in (5, 7):
        assert add(pk=two_turns[0].pk, tokens=tokens) == 1
    assert Turn.objects.get(pk=two_turns[0].pk).prompt_tokens == two_turns[0].prompt_tokens + 12
    assert Turn.objects.get(pk=two_turns[1].pk).prompt_tokens == two_turns[1].prompt_tokens


def test_an_update_takes_exactly_its_values(two_turns):
    add = CompiledUpdate(lambda p: (Turn.objects.filter(pk=p.pk), {"prompt_tokens": F("prompt_tokens") + p.tokens}))
    with pytest.raises(TypeError, match="takes the values"):
        add(pk=two_turns[0].pk)
    with pytest.raises(TypeError, match="takes the values"):
        add(pk=two_turns[0].pk, tokens=1, cost=2)
    assert Turn.objects.get(pk=two_turns[0].pk).prompt_tokens == two_turns[0].prompt_tokens
