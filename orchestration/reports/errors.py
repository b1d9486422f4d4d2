"""Errors in plain words, with the technical text kept behind them.

What failed is stored as the code that saw it wrote it ("LLM error 503: Error code: 503 -
{'error': ...}"): the audit and the export keep that whole. A person reading the chat, the
timeline or the waterfall gets a sentence first; the technical text stays one click away
(the `failure` template filter puts it in a disclosure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Prefixes the engine adds as an error travels up (the agent's loop, the orchestrator's end).
_WRAPPERS = ("The model could not be reached: ", "LLM error: ")
_STATUS = re.compile(r"^LLM error (\d{3}): ")
_KINDS = (
    ("LLM rate limit", "The model service is limiting requests and asked to slow down."),
    ("LLM quota exhausted", "The model account has run out of quota."),
    ("LLM endpoint unreachable", "The model service could not be reached."),
    ("LLM stream interrupted", "The model's answer broke off before it was complete."),
    ("LLM response unusable", "The model service sent an answer that could not be read."),
)


@dataclass(frozen=True)
class Failure:
    words: str  # a sentence for the page
    detail: str = ""  # the stored text, when it says more than the words

    def __str__(self) -> str:
        return self.words


def failure_of(error: str) -> Failure:
    """`error` as a person reads it: the model service's failures in words (with the
    HTTP status a support desk asks for), anything else as it was written."""
    error = str(error or "").strip()
    inner = error
    while inner.startswith(_WRAPPERS):
        inner = next(inner.removeprefix(w) for w in _WRAPPERS if inner.startswith(w))
    if match := _STATUS.match(inner):
        status = int(match.group(1))
        side = "had an error on its side" if status >= 500 else "refused the request"
        return Failure(f"The model service {side} (HTTP {status}).", inner)
    for prefix, words in _KINDS:
        if inner.startswith(prefix):
            return Failure(words, inner)
    return Failure(error)
