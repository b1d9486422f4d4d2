"""What one model call costs, from the price table in settings (ASSISTANT_MODEL_PRICES).

Prices are US dollars per million tokens. Providers report cached prompt tokens as a
part of the prompt tokens, and price them apart (cheaper): so a call costs its uncached
prompt tokens at `input`, its cached ones at `cached_input` and its completion tokens at
`output`. Decimal throughout, so that a conversation's thousand calls add up to the
cent the provider bills, not to a float's neighbour of it.

A model the table does not know has no cost (None), never a guessed one: the pages then
say how many calls have no price instead of showing a figure that is too low.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings

from orchestration.llm.base import Usage

MILLION = Decimal(1_000_000)
# LLMCall.cost_usd's precision: a cheap model's call costs millionths of a dollar.
COST_PLACES = Decimal("1e-10")
PRICE_KEYS = {"input", "cached_input", "output"}


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens of one model."""

    input: Decimal
    cached_input: Decimal
    output: Decimal

    @classmethod
    def from_entry(cls, entry: dict) -> Price:
        # str() first: Decimal(0.15) is 0.1499999999999999944488848768742172978818416595458984375.
        input_ = Decimal(str(entry["input"]))
        cached = Decimal(str(entry["cached_input"])) if "cached_input" in entry else input_
        return cls(input=input_, cached_input=cached, output=Decimal(str(entry["output"])))


def price_table_problems(table) -> list[str]:
    """What is wrong with a price table, one line each (empty: nothing). The system check
    (orchestration/checks.py) reports these at start-up rather than at the first call."""
    if not isinstance(table, dict):
        return [f"the table must be a mapping of model names to prices, not {type(table).__name__}"]
    problems = []
    for model, entry in table.items():
        if not isinstance(entry, dict):
            problems.append(f"{model!r}: a price must be an object with input, cached_input and output")
            continue
        missing = {"input", "output"} - entry.keys()
        if missing:
            problems.append(f"{model!r}: missing {', '.join(sorted(missing))}")
        unknown = entry.keys() - PRICE_KEYS
        if unknown:
            problems.append(f"{model!r}: unknown keys {', '.join(sorted(unknown))} (use {', '.join(sorted(PRICE_KEYS))})")
        for key in sorted(entry.keys() & PRICE_KEYS):
            if not _is_price(entry[key]):
                problems.append(f"{model!r}: {key} must be a number of dollars per million tokens, >= 0")
    return problems


def _is_price(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return False
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return False
    return number.is_finite() and number >= 0


def price_for(model: str, table: dict | None = None) -> Price | None:
    """The model's price: its own entry, else the longest entry it extends with a dash
    (a dated snapshot such as gpt-4o-mini-2024-07-18 is billed as gpt-4o-mini, not as
    gpt-4o), else None."""
    table = settings.ASSISTANT_MODEL_PRICES if table is None else table
    if model in table:
        return Price.from_entry(table[model])
    bases = [name for name in table if model.startswith(name + "-")]
    if not bases:
        return None
    return Price.from_entry(table[max(bases, key=len)])


def call_cost(model: str, usage: Usage) -> Decimal | None:
    """The cost of one call in US dollars, or None when the model has no price."""
    price = price_for(model)
    if price is None:
        return None
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    cost = ((usage.prompt_tokens - cached) * price.input + cached * price.cached_input
            + usage.completion_tokens * price.output) / MILLION
    return cost.quantize(COST_PLACES, rounding=ROUND_HALF_UP)


def format_usd(amount: Decimal | None) -> str:
    """Money as people read it: "$0.0123" under a dollar (a call costs fractions of a
    cent), "$12.35" above, "<$0.0001" for what would round to nothing; "" for None.
    Every page, the admin and the terminal format costs here."""
    if amount is None:
        return ""
    if amount == 0:
        return "$0.00"
    if amount < Decimal("0.0001"):
        return "<$0.0001"
    if amount < 1:
        return f"${amount.quantize(Decimal('0.0001'), rounding=ROUND_HALF_UP)}"
    return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"
