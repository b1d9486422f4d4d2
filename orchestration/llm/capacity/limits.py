"""The configured limits of one provider endpoint and model (ASSISTANT_PROVIDER_LIMITS).

A deployment says what its key may use, per model: requests per minute (`rpm`), tokens
per minute (`tpm`) and, optionally, how much of that may go at once (`burst_seconds`:
the bucket holds this many seconds' worth; 1 by default, because providers enforce a
per-minute limit over shorter windows too). A model with no entry takes the "*" entry;
a model with neither is unlimited until the provider's headers say otherwise
(`x-ratelimit-limit-*`, observe() in limiter.py).

Defaults exist only for OpenAI's own endpoint (base URL unset or api.openai.com): the
limits of its first paid tier for the models it prices in assistant/settings.py. A key on
a higher tier is corrected upward by the first response's headers. A model name means
nothing definite on another server (a local vLLM may call anything "gpt-4o-mini"), so
there the defaults do not apply.

Bad entries are refused at start: `manage.py check` (and every command that runs the
checks, qcluster included) reports orchestration.E002, and the limiter refuses to run
(ImproperlyConfigured).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULT_BURST_SECONDS = 1.0

# OpenAI's usage tier 1 (https://platform.openai.com/docs/guides/rate-limits), per model.
OPENAI_DEFAULT_LIMITS = {
    "gpt-4o-mini": {"rpm": 500, "tpm": 200_000},
    "gpt-4o": {"rpm": 500, "tpm": 30_000},
    "gpt-4.1": {"rpm": 500, "tpm": 30_000},
    "gpt-4.1-mini": {"rpm": 500, "tpm": 200_000},
    "gpt-4.1-nano": {"rpm": 500, "tpm": 200_000},
}
OPENAI_HOST = "api.openai.com"
_KEYS = {"rpm", "tpm", "burst_seconds"}
_SNAPSHOT = re.compile(r"^(.+)-\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class Limits:
    """What one (endpoint, model) may use; None: no limit of that kind is known."""

    rpm: int | None = None
    tpm: int | None = None
    burst_seconds: float = DEFAULT_BURST_SECONDS


def limit_table_problems(table) -> list[str]:
    """What is wrong with an ASSISTANT_PROVIDER_LIMITS table (empty: nothing)."""
    if not isinstance(table, dict):
        return [f"must be a JSON object of models, not {type(table).__name__}"]
    problems = []
    for model, entry in table.items():
        if not isinstance(entry, dict):
            problems.append(f"{model!r} must be an object such as {{\"rpm\": 500, \"tpm\": 200000}}")
            continue
        if unknown := set(entry) - _KEYS:
            problems.append(f"{model!r} has unknown keys {sorted(unknown)} (rpm, tpm, burst_seconds)")
        for key in ("rpm", "tpm"):
            value = entry.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                problems.append(f"{model!r}: {key} must be a whole number of at least 0 (0: no limit), not {value!r}")
        burst = entry.get("burst_seconds")
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, (int, float))
                                  or not math.isfinite(burst) or not 0 < burst <= 60):
            problems.append(f"{model!r}: burst_seconds must be a number above 0 and at most 60, not {burst!r}")
    return problems


def concurrency_problems(value) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return [f"ASSISTANT_PROVIDER_CONCURRENCY must be a whole number of at least 0 (0: no cap), not {value!r}"]
    return []


def settings_checked() -> None:
    """Raise ImproperlyConfigured when the limits cannot be used."""
    problems = limit_table_problems(settings.ASSISTANT_PROVIDER_LIMITS) + concurrency_problems(
        settings.ASSISTANT_PROVIDER_CONCURRENCY)
    if problems:
        raise ImproperlyConfigured("ASSISTANT_PROVIDER_LIMITS: " + "; ".join(problems))


def is_openai(base_url: str | None) -> bool:
    return not base_url or urlsplit(base_url).hostname == OPENAI_HOST


def limits_for(base_url: str | None, model: str) -> Limits:
    """The configured limits of `model` on the endpoint at `base_url` (before any header
    corrects them). A dated snapshot (gpt-4o-mini-2024-07-18) takes its model's entry."""
    table = settings.ASSISTANT_PROVIDER_LIMITS
    defaults = OPENAI_DEFAULT_LIMITS if is_openai(base_url) else {}
    entry = _entry(table, model) or _entry(defaults, model) or table.get("*") or {}
    return Limits(rpm=entry.get("rpm") or None, tpm=entry.get("tpm") or None,
                  burst_seconds=float(entry.get("burst_seconds") or DEFAULT_BURST_SECONDS))


def _entry(table: dict, model: str) -> dict | None:
    if model in table:
        return table[model]
    snapshot = _SNAPSHOT.match(model)  # name-YYYY-MM-DD
    return table.get(snapshot.group(1)) if snapshot else None
