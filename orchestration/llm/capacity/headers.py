"""What a provider's response headers say about its limits.

OpenAI (and most compatible providers) send, on every answer:
x-ratelimit-limit-requests / -tokens (per minute), x-ratelimit-remaining-requests /
-tokens, x-ratelimit-reset-requests / -tokens (a duration: "1s", "6m0s", "20ms"); and on a
429, Retry-After (seconds or an HTTP date) or retry-after-ms.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from orchestration.llm.capacity.buckets import Observed

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str | None) -> float | None:
    """'6m0s' → 360.0, '20ms' → 0.02, '1.5' → 1.5; None when it says nothing usable."""
    if not text:
        return None
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def _int(value: str | None) -> int | None:
    try:
        return max(0, int(float(value))) if value not in (None, "") else None
    except ValueError:
        return None


def observed(headers: Mapping[str, str]) -> Observed:
    h = {key.lower(): value for key, value in headers.items()}
    return Observed(
        limit_requests=_int(h.get("x-ratelimit-limit-requests")),
        limit_tokens=_int(h.get("x-ratelimit-limit-tokens")),
        remaining_requests=_int(h.get("x-ratelimit-remaining-requests")),
        remaining_tokens=_int(h.get("x-ratelimit-remaining-tokens")),
        reset_requests=duration_seconds(h.get("x-ratelimit-reset-requests")),
        reset_tokens=duration_seconds(h.get("x-ratelimit-reset-tokens")),
    )


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """How long a 429 asks us to stay away: retry-after-ms, Retry-After (seconds or a
    date), else the later of the reset headers of whatever has nothing remaining."""
    h = {key.lower(): value for key, value in headers.items()}
    if (ms := h.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    if (after := h.get("retry-after")) is not None:
        seconds = duration_seconds(after)
        if seconds is not None:
            return seconds
        try:
            return max(0.0, parsedate_to_datetime(after).timestamp() - time.time())
        except (TypeError, ValueError):
            pass
    seen = observed(h)
    resets = [reset for remaining, reset in ((seen.remaining_requests, seen.reset_requests),
                                             (seen.remaining_tokens, seen.reset_tokens))
              if reset is not None and remaining in (0, None)]
    return max(resets) if resets else None
