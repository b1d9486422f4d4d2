"""What one model call costs (orchestration/budgets/pricing.py), and the price table's shape."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from assistant.env import env_json_object
from orchestration.budgets.pricing import call_cost, format_usd, price_for, price_table_problems
from orchestration.checks import model_prices_are_a_price_table
from orchestration.llm import Usage

TABLE = {
    "gpt-4o": {"input": 2.50, "cached_input": 1.25, "output": 10.00},
    "gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.60},
    "local": {"input": 0, "output": 0},
}


@pytest.fixture(autouse=True)
def prices(settings):
    settings.ASSISTANT_MODEL_PRICES = TABLE


def test_cached_prompt_tokens_are_priced_apart_from_the_rest():
    # 1000 prompt tokens of which 400 cached, 200 completion tokens, on gpt-4o-mini:
    # 600 × 0.15 + 400 × 0.075 + 200 × 0.60 = 90 + 30 + 120 = 240 dollars per million tokens.
    cost = call_cost("gpt-4o-mini", Usage(prompt_tokens=1000, completion_tokens=200, cached_tokens=400))
    assert cost == Decimal("0.000240")


def test_the_sum_is_exact_in_decimal():
    """0.15 as a float is 0.1499999…: a thousand calls would drift from the bill."""
    cost = call_cost("gpt-4o-mini", Usage(prompt_tokens=1, completion_tokens=0))
    assert cost == Decimal("0.00000015")
    assert sum([cost] * 1000) == Decimal("0.00015")


def test_a_dated_snapshot_takes_its_models_price_and_the_longest_name_wins():
    assert price_for("gpt-4o-mini-2024-07-18") == price_for("gpt-4o-mini")
    assert price_for("gpt-4o-2024-08-06") == price_for("gpt-4o")
    assert price_for("gpt-4o-mini") != price_for("gpt-4o")


@pytest.mark.parametrize("model", ["offline-planner", "gpt-4omni", "gpt-4", "llama3:8b", "", "openai/gpt-4o"])
def test_a_model_without_a_price_has_no_cost(model):
    assert price_for(model) is None
    assert call_cost(model, Usage(prompt_tokens=1000, completion_tokens=100)) is None


def test_without_a_cached_price_cached_tokens_cost_the_input_price(settings):
    settings.ASSISTANT_MODEL_PRICES = {"m": {"input": 1, "output": 2}}
    assert call_cost("m", Usage(prompt_tokens=1_000_000, completion_tokens=0, cached_tokens=500_000)) == 1


def test_a_free_model_costs_zero_not_unknown():
    assert call_cost("local", Usage(prompt_tokens=5000, completion_tokens=500)) == 0


def test_the_default_table_prices_the_default_models(settings):
    from assistant import settings as defaults

    settings.ASSISTANT_MODEL_PRICES = defaults.DEFAULT_MODEL_PRICES
    assert price_table_problems(defaults.DEFAULT_MODEL_PRICES) == []
    for model in (defaults.ASSISTANT_ORCHESTRATOR_MODEL, defaults.ASSISTANT_AGENT_MODEL, "gpt-4.1-nano-2025-04-14"):
        assert price_for(model) is not None
    assert price_for("gpt-4.1-mini").output == Decimal("1.6")


@pytest.mark.parametrize("amount, shown", [
    (None, ""),
    (Decimal(0), "$0.00"),
    (Decimal("0.00000015"), "<$0.0001"),
    (Decimal("0.0001"), "$0.0001"),
    (Decimal("0.01234567"), "$0.0123"),
    (Decimal("0.99"), "$0.9900"),
    (Decimal("12.345"), "$12.35"),
    (Decimal("1234.5"), "$1,234.50"),
])
def test_money_is_formatted_for_people(amount, shown):
    assert format_usd(amount) == shown


@pytest.mark.parametrize("table, problem", [
    ([], "must be a mapping"),
    ({"m": 0.15}, "must be an object"),
    ({"m": {"input": 0.15}}, "missing output"),
    ({"m": {"input": -1, "output": 1}}, "input must be a number"),
    ({"m": {"input": "cheap", "output": 1}}, "input must be a number"),
    ({"m": {"input": True, "output": 1}}, "input must be a number"),
    ({"m": {"input": 1, "output": 1, "cached": 0.5}}, "unknown keys cached"),
])
def test_a_malformed_table_is_reported(table, problem):
    [reported] = price_table_problems(table)
    assert problem in reported


def test_the_system_check_names_the_bad_entry(settings):
    settings.ASSISTANT_MODEL_PRICES = {**TABLE, "broken": {"input": 1}}
    [error] = model_prices_are_a_price_table()
    assert error.id == "orchestration.E001" and "'broken': missing output" in error.msg
    settings.ASSISTANT_MODEL_PRICES = TABLE
    assert model_prices_are_a_price_table() == []


def test_the_environment_extends_the_table_or_fails_loudly(monkeypatch):
    monkeypatch.setenv("PRICES", '{"my-model": {"input": 0.2, "output": 0.8}}')
    assert env_json_object("PRICES", {}) == {"my-model": {"input": 0.2, "output": 0.8}}
    monkeypatch.setenv("PRICES", "{not json")
    with pytest.raises(ImproperlyConfigured, match="PRICES is not valid JSON"):
        env_json_object("PRICES", {})
    monkeypatch.setenv("PRICES", "[1, 2]")
    with pytest.raises(ImproperlyConfigured, match="must be a JSON object"):
        env_json_object("PRICES", {})
