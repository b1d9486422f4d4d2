"""Tokens and costs rolled up per agent, per turn and per conversation (selectors).

The stored model calls (LLMCall) are the one source: each has its tokens and its cost,
and is written the moment its response arrives, so an agent still running counts as far
as it got. A few grouped queries add them up in the database (per dispatch and model);
the tree (a delegating agent includes its children's calls) is built here in Python.

A call without a price (the offline planner, a model missing from the price table) adds
its tokens but no cost; a total says how many such calls it holds, so a page shows
"cost unknown" instead of a figure that is too low.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Case, Count, F, Q, QuerySet, Sum, Value, When

from orchestration.budgets.pricing import COST_PLACES, format_usd
from orchestration.models import AgentDispatch, Conversation, LLMCall, Turn
from orchestration.records.compiled import CompiledRead


@dataclass(frozen=True)
class Spend:
    """What a set of model calls used. `cost_usd` sums the priced calls only;
    `unpriced` counts the others by model, e.g. (("offline-planner", 3),)."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    unpriced: tuple[tuple[str, int], ...] = ()

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            llm_calls=self.llm_calls + other.llm_calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            unpriced=tuple(sorted((Counter(dict(self.unpriced)) + Counter(dict(other.unpriced))).items())),
        )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def unpriced_calls(self) -> int:
        return sum(calls for _, calls in self.unpriced)

    @property
    def cost(self) -> Decimal | None:
        """The cost, or None when not one call had a price (an offline turn has no cost
        at all, rather than a cost of $0)."""
        return self.cost_usd if self.llm_calls > self.unpriced_calls else None

    def unpriced_note(self) -> str:
        if not self.unpriced:
            return ""
        parts = [f"{calls} call{'s' if calls != 1 else ''} of {model or 'an unnamed model'}"
                 for model, calls in self.unpriced]
        verb = "has" if self.unpriced_calls == 1 else "have"
        return f"cost unknown: {', '.join(parts)} {verb} no price"

    def cost_text(self) -> str:
        """The cost as pages show it: "$0.0123"; with calls that have no price, the
        priced part as a lower bound and what is missing; "" when nothing is priced."""
        if self.cost is None:
            return ""
        if self.unpriced:
            return f"at least {format_usd(self.cost)} ({self.unpriced_note()})"
        return format_usd(self.cost)

    def summary(self) -> str:
        """Tokens and cost in a few words: "1234 tokens · $0.0012"."""
        cost = self.cost_text()
        return f"{self.total_tokens} tokens" + (f" · {cost}" if cost else "")

    def to_json(self) -> dict:
        """The export's form: the cost as an exact decimal string, null when unknown."""
        return {
            "llm_calls": self.llm_calls, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
            "cost_usd": None if self.cost is None else f"{self.cost:f}",
            "unpriced_calls": [{"model": model, "calls": calls} for model, calls in self.unpriced],
        }

    @classmethod
    def from_json(cls, data: dict) -> Spend:
        return cls(
            llm_calls=data.get("llm_calls", 0), prompt_tokens=data.get("prompt_tokens", 0),
            completion_tokens=data.get("completion_tokens", 0), cached_tokens=data.get("cached_tokens", 0),
            cost_usd=Decimal(data.get("cost_usd") or 0),
            unpriced=tuple((item["model"], item["calls"]) for item in data.get("unpriced_calls", [])),
        )


@dataclass(frozen=True)
class TurnSpend:
    """A turn's spend: the orchestrator's, each agent's own and with its descendants'."""

    own: dict = field(default_factory=dict)  # dispatch id (None: the orchestrator) → Spend
    with_children: dict = field(default_factory=dict)  # dispatch id → its own + its descendants'
    total: Spend = Spend()

    @property
    def orchestrator(self) -> Spend:
        return self.own.get(None, Spend())

    def agent(self, dispatch_id: int) -> Spend:
        return self.own.get(dispatch_id, Spend())

    def agent_total(self, dispatch_id: int) -> Spend:
        return self.with_children.get(dispatch_id, Spend())


def _spends(calls: QuerySet[LLMCall], *keys: str) -> dict:
    """The calls' spend per value of `keys`, one grouped query (by model too, to name
    the models without a price)."""
    return _summed(_grouped(calls, *keys), keys)


def _grouped(calls: QuerySet[LLMCall], *keys: str) -> QuerySet:
    return calls.order_by().values(*keys, "model").annotate(
        n=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"),
        cached=Sum("cached_tokens"), cost=Sum("cost_usd"), unpriced=Count("id", filter=Q(cost_usd__isnull=True)),
    )


def _summed(rows, keys: tuple[str, ...]) -> dict:
    spends: dict = {}
    for row in rows:
        key = tuple(row[k] for k in keys)
        spend = Spend(llm_calls=row["n"], prompt_tokens=row["prompt"], completion_tokens=row["completion"],
                      cached_tokens=row["cached"], cost_usd=(row["cost"] or Decimal(0)).quantize(COST_PLACES),
                      unpriced=((row["model"], row["unpriced"]),) if row["unpriced"] else ())
        spends[key] = spends.get(key, Spend()) + spend
    return spends


def roll_up(own: dict, parents: dict) -> TurnSpend:
    """`own` spend per dispatch id (None: the orchestrator) and each dispatch's parent id:
    each agent's total adds all its descendants' (a lead pays for its helpers)."""
    with_children = {pk: Spend() for pk in parents}
    for pk in parents:
        spend, node = own.get(pk, Spend()), pk
        while node in parents:  # up the chain of parents: nesting is at most a few deep
            with_children[node] += spend
            node = parents.get(node)
    return TurnSpend(own=own, with_children=with_children, total=sum(own.values(), Spend()))


def turn_spend(turn: Turn, dispatches: list[AgentDispatch] | None = None) -> TurnSpend:
    """The turn's spend, from one grouped query (and one for the dispatches' parent
    links, unless the caller has the turn's `dispatches` already)."""
    own = {dispatch_id: spend for (dispatch_id,), spend in
           _spends(LLMCall.objects.filter(turn_id=turn.pk), "dispatch_id").items()}
    if dispatches is None:
        parents = dict(turn.dispatches.values_list("id", "parent_id"))
    else:
        parents = {d.pk: d.parent_id for d in dispatches}
    return roll_up(own, parents)


def _turn_and_conversation_calls(turn_id: int, conversation_id: int) -> QuerySet:
    in_turn = Q(turn_id=turn_id)
    return _grouped(LLMCall.objects.filter(turn__conversation_id=conversation_id).annotate(
        this_turn=Case(When(in_turn, then=Value(True)), default=Value(False)),
        agent=Case(When(in_turn, then=F("dispatch_id")), default=None),
    ), "this_turn", "agent")


# The live page's counters and agent graph read it with every render of a running turn.
_turn_and_conversation_spends = CompiledRead(_turn_and_conversation_calls, arity=2)


def turn_and_conversation_spend(turn: Turn, dispatches: list[AgentDispatch]) -> tuple[TurnSpend, Spend]:
    """The turn's spend (as `turn_spend`, given its `dispatches`) and its whole
    conversation's, from one grouped query: the live page's counters and agent graph
    show both at once. The conversation's other turns are summed per model, not per agent."""
    spends = _summed(_turn_and_conversation_spends.dicts(turn.pk, turn.conversation_id), ("this_turn", "agent"))
    own = {agent: spend for (this_turn, agent), spend in spends.items() if this_turn}
    return roll_up(own, {d.pk: d.parent_id for d in dispatches}), sum(spends.values(), Spend())


# The live page's counters read it with each turn's start and end.
_conversation_spends = CompiledRead(lambda conversation_id: _grouped(
    LLMCall.objects.filter(turn__conversation_id=conversation_id)))


def conversation_spend(conversation: Conversation) -> Spend:
    """The whole conversation's spend, every turn and agent: one query."""
    return sum(_summed(_conversation_spends.dicts(conversation.pk), ()).values(), Spend())
