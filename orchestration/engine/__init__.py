"""The engine: one step machine that every role runs (DESIGN.md §4).

`loop.py` is the machine, top to bottom: claim → replay the stored answer or ask the
model → store it → act on its tool calls → the next step. `orchestrator.py` and
`agent.py` are the two roles it runs (a nested agent is an agent): they differ by
their prompts, tools and limits, not by their loop.
"""
