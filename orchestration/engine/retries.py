"""Engine-level retries of one model call (DESIGN.md §4).

The openai SDK already retries 429, 5xx and timeouts a few times within a second or
two. A provider's outage often lasts longer; then the engine asks again, after a longer
wait, with the very same messages: the call resumes the agent (or the orchestrator) from
the transcript as it stood, never from its start, so no finished tool call is asked for
again. The retries used are counted on the agent (or the turn), across deliveries.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from django.conf import settings

from orchestration.llm import LLMError, LLMResponse

MAX_BACKOFF_SECONDS = 30.0


def backoff_seconds(retry: int) -> float:
    """The wait before retry number `retry` (1, 2, ...): doubling from the setting."""
    return min(settings.ASSISTANT_LLM_RETRY_BACKOFF_SECONDS * 2 ** (retry - 1), MAX_BACKOFF_SECONDS)


async def complete_retrying(
    complete: Callable[[], Awaitable[LLMResponse]],
    *,
    used: int,
    allowed: int,
    before_retry: Callable[[int, LLMError, float], Awaitable[None]],
) -> tuple[LLMResponse, int]:
    """(`complete()`, how long its successful call took in ms), asked again while it fails
    transiently and retries are left.

    `used` retries were spent before (by earlier deliveries). `before_retry(retry,
    error, delay)` records the retry, waits `delay` seconds and checks that the work is
    still wanted (it raises if the turn was stopped meanwhile). A permanent error, or
    one past the last retry, is raised to the caller."""
    while True:
        started = time.monotonic()
        try:
            response = await complete()
            return response, int((time.monotonic() - started) * 1000)
        except LLMError as exc:
            if not exc.transient or used >= allowed:
                raise
            used += 1
            await before_retry(used, exc, backoff_seconds(used))
