"""System checks for settings that are valid alone but dangerous together, or malformed."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register

from orchestration.budgets.pricing import price_table_problems
from orchestration.llm.capacity.limits import concurrency_problems, limit_table_problems


@register()
def lease_outlasts_a_step(app_configs=None, **kwargs):
    llm = settings.ASSISTANT_LLM_TIMEOUT_SECONDS * (settings.ASSISTANT_LLM_MAX_RETRIES + 1)
    step = max(llm, settings.ASSISTANT_LIMITS["skill_timeout_seconds"])
    problems = []
    if settings.ASSISTANT_LEASE_SECONDS <= settings.ASSISTANT_DB_RETRY_SECONDS:
        problems.append(Warning(
            f"ASSISTANT_LEASE_SECONDS ({settings.ASSISTANT_LEASE_SECONDS}) does not outlast "
            f"ASSISTANT_DB_RETRY_SECONDS ({settings.ASSISTANT_DB_RETRY_SECONDS:.0f}).",
            hint="A step retrying through a database restart would lose its lease to the reaper meanwhile.",
            id="orchestration.W002",
        ))
    if settings.ASSISTANT_LEASE_SECONDS > step:
        return problems
    return problems + [
        Warning(
            f"ASSISTANT_LEASE_SECONDS ({settings.ASSISTANT_LEASE_SECONDS}) does not outlast one step "
            f"(an LLM call with retries can take {llm:.0f} s).",
            hint="Raise ASSISTANT_LEASE_SECONDS, or lower ASSISTANT_LLM_TIMEOUT_SECONDS / "
            "ASSISTANT_LLM_MAX_RETRIES: otherwise the reaper may hand a live agent to a second worker.",
            id="orchestration.W001",
        )
    ]


@register()
def model_prices_are_a_price_table(app_configs=None, **kwargs):
    return [
        Error(
            f"ASSISTANT_MODEL_PRICES: {problem}.",
            hint='Prices are US dollars per million tokens, e.g. {"my-model": {"input": 0.4, '
            '"cached_input": 0.1, "output": 1.6}} (cached_input is optional).',
            id="orchestration.E001",
        )
        for problem in price_table_problems(settings.ASSISTANT_MODEL_PRICES)
    ]


@register()
def provider_limits_are_a_limit_table(app_configs=None, **kwargs):
    problems = [f"ASSISTANT_PROVIDER_LIMITS: {problem}." for problem in
                limit_table_problems(settings.ASSISTANT_PROVIDER_LIMITS)]
    problems += [f"{problem}." for problem in concurrency_problems(settings.ASSISTANT_PROVIDER_CONCURRENCY)]
    return [
        Error(problem, hint='Limits are per model, per minute: {"gpt-4o-mini": {"rpm": 500, "tpm": 200000}, '
              '"*": {"rpm": 60}} (0 or no entry: no limit).', id="orchestration.E002")
        for problem in problems
    ]


@register()
def mcp_servers_file_is_valid(app_configs=None, **kwargs):
    """A server the settings file describes wrongly would break every catalogue: refuse
    to start instead."""
    from skills.mcp.config import settings_problems

    return [Error(f"ASSISTANT_MCP_SERVERS_FILE ({settings.ASSISTANT_MCP_SERVERS_FILE}): {problem}.",
                  hint='A JSON list: [{"name": "wiki", "url": "http://127.0.0.1:8765/mcp", "everyone": true}, '
                       '{"name": "notes", "command": "python", "args": ["-m", "skills.mcp.example_server"]}].',
                  id="orchestration.E003")
            for problem in settings_problems()]
