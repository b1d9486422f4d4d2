"""Replay: a stored turn run again through the current engine, from its records only.

The stored model answers stand in for the model and the stored skill results for the
skills (replaying.py): no model is called, no skill's handler runs, nothing is sent.
What the new run does differently from the stored one is reported as divergences: how
an engine change would have played out on real past turns. `manage.py replay TURN`.
"""
