"""Reads compiled once per process (orchestration/records/compiled.py): each call gives
what its queryset would, for whichever ids it is given, converted as Django converts
rows (JSON, times, booleans, decimals), on both databases, without building it again."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import Count, Q, Sum

from orchestration.models import AgentDispatch, Event, LLMCall
from orchestration.records.compiled import CompiledRead
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
