"""The scripted LLM server lives with the benchmark that also uses it."""

from orchestration.bench.llm_server import *  # noqa: F401,F403
from orchestration.bench.llm_server import agent_of  # noqa: F401
