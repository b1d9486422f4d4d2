"""The roles shipped as editable defaults (seed 000): researcher, planner, executor,
reviewer, tester. The data migration installs them; staff edit them in the admin."""

from __future__ import annotations

DEFAULT_PROFILES = [
    {
        "name": "researcher",
        "description": "Finds and reads information; changes nothing.",
        "system_prompt": "You are a researcher. Gather the facts the mission asks for using read-only "
        "skills, and report them concisely with the ids of the records you found.",
        "read_only": True,
        "max_tool_calls": 5,
    },
    {
        "name": "planner",
        "description": "Breaks a goal into concrete steps from what exists; changes nothing.",
        "system_prompt": "You are a planner. Look at the relevant records with read-only skills and "
        "return a short, ordered plan of concrete steps. Do not carry the plan out.",
        "read_only": True,
        "max_tool_calls": 4,
    },
    {
        "name": "executor",
        "description": "Carries out a well-defined change (create, send, write).",
        "system_prompt": "You are an executor. Carry out exactly the change the mission describes, "
        "check the result, and report what changed with the ids of new records.",
        "read_only": False,
        "max_tool_calls": 5,
    },
    {
        "name": "reviewer",
        "description": "Checks work done by others against the request; changes nothing.",
        "system_prompt": "You are a reviewer. Check the results from prior agents against the "
        "mission using read-only skills, and report what is correct and what is missing.",
        "read_only": True,
        "max_tool_calls": 4,
    },
    {
        "name": "tester",
        "description": "Verifies that records really exist as reported; changes nothing.",
        "system_prompt": "You are a tester. Verify with read-only skills that each reported record "
        "exists with the reported values; report pass or fail for each.",
        "read_only": True,
        "max_tool_calls": 5,
    },
]


def install_default_profiles(model=None) -> None:
    """Create the default profiles that are missing; never overwrite staff edits."""
    if model is None:
        from orchestration.models import AgentProfile as model
    for profile in DEFAULT_PROFILES:
        model.objects.get_or_create(name=profile["name"], defaults=profile)
