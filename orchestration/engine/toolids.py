"""Tool-call ids unique in a run's history, whatever the server sends.

They key a run's skill executions and its agents, so they must be unique within it. Some
servers number calls per response ('call_0' every time), some send none, some reuse an
id across responses: renamed before the answer is stored, so a replay sees the same ids.
"""

from __future__ import annotations

from orchestration.llm import ToolCall


def unique_ids(calls: list[ToolCall], taken: set[str], *, suffix: str, blank: str) -> list[ToolCall]:
    """`calls` with every id unique against `taken` (and each other): a missing id is
    `blank` + its index; a taken one gets `~suffix` until it is free."""
    taken = set(taken)
    unique = []
    for index, call in enumerate(calls):
        call_id = call.id or f"{blank}{index}"
        while call_id in taken:
            call_id = f"{call_id}~{suffix}"
        taken.add(call_id)
        unique.append(ToolCall(id=call_id, name=call.name, arguments=call.arguments))
    return unique
