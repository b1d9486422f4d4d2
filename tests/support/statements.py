"""What a statement budget counts: one definition for the budget tests
(tests/orchestration/test_statement_budget.py, test_claims.py, tests/web/test_post_budget.py)
and the bench's per-step figures (benchmarks/runner.py), which must agree with them."""

from __future__ import annotations

import re

# Transaction control is not a statement of the work.
CONTROL = re.compile(r"^\s*(BEGIN|SAVEPOINT|RELEASE|ROLLBACK|COMMIT)", re.I)
# Reads a process makes at most every so often, however many steps it takes: the provider
# limiter's read of an unmetered model's row in the database (at most one per process every
# UNMETERED_SECONDS; none with Redis: orchestration/llm/capacity/stores.py) and the MCP
# servers configured (at most one every ASSISTANT_MCP_CONFIG_SECONDS: skills/mcp/config.py).
# Counted per step, they made a figure depend on how long the run took.
TIME_BOUNDED = re.compile(r'"(orchestration_providercapacity|skills_mcpserver\w*)"')
# Those, and the skill handler's own reads of its table (tasks.search reads two statements
# of skills_task): neither is the engine's step.
NOT_THE_STEPS = re.compile(rf'"skills_task"|{TIME_BOUNDED.pattern}')
