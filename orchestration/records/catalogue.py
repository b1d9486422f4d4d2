"""Every type of event the engine writes (`Event.type`), in one place.

An event's type is stored with its row and read back by the timeline, the waterfall,
the live panels and the audit, so a name here is part of the stored data: rename one
only with a data migration. Templates may compare against the strings themselves.
"""

from __future__ import annotations

# A turn: started by the owner's message, then answered, failed, stopped or paused
# (and resumed by Continue or an approval).
TURN_STARTED = "turn.started"
TURN_PAUSED = "turn.paused"
TURN_RESUMED = "turn.resumed"
TURN_COMPLETED = "turn.completed"
TURN_FAILED = "turn.failed"
TURN_STOPPED = "turn.stopped"

# What the engine asked the owner, and how it was answered.
LIMIT_TRIPPED = "limit.tripped"
APPROVAL_DECIDED = "approval.decided"

# The orchestrator's model calls: one per call, and one per failed call that is retried.
ORCHESTRATOR_LLM_CALL = "orchestrator.llm_call"
ORCHESTRATOR_LLM_RETRY = "orchestrator.llm_retry"

# A model call (either role's) that waited for the provider's rate limit (orchestration/
# llm/capacity/) longer than half a second: one event when the wait ends, with how long.
LLM_WAITING = "llm.waiting"

# A sub-agent's lifecycle (DESIGN.md §4), and its model calls: one per step.
AGENT_CREATED = "agent.subagent_created"
AGENT_STARTED = "agent.subagent_started"
AGENT_ATTEMPT = "agent.subagent_attempt"  # a failed attempt (or model call) that is retried
AGENT_WAITING_FOR_MERGE = "agent.subagent_waiting_for_merge"
AGENT_FAILED = "agent.subagent_failed"
AGENT_CLOSED = "agent.subagent_closed"
AGENT_LLM_CALL = "agent.llm_call"

# A skill call made by an agent: reserved (it counts toward the limits) and finished.
SKILL_STARTED = "skill.started"
SKILL_FINISHED = "skill.finished"

# The turn runs after these (its answer may stream) and rests after those.
TURN_RUNS = (TURN_STARTED, TURN_RESUMED)
TURN_RESTS = (TURN_COMPLETED, TURN_FAILED, TURN_STOPPED, TURN_PAUSED)
