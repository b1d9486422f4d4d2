"""The offline planner: the embedded default when no API key is set.

Deterministic and without network, yet it drives the real pipeline: the orchestrator
side plans from the catalogue in its prompt (no discovery calls), dispatches agents (with depends_on) from the user's words, waits
for them and writes an answer from their results; the agent side turns the planned call
in its context into real `use_skill` calls. It is a function of the messages alone, so a
replay or a second worker gets the same answer. It says plainly that it is offline.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime, time, timedelta

from django.utils import timezone

from orchestration.llm.base import LLMResponse, ToolCall, Usage
from skills.domains.common import when_words

OFFLINE_MODEL = "offline-planner"
BANNER = "*(Offline planner — no LLM API key is configured, so this answer was planned by simple rules.)*"
PLAN_MARKER = "Planned call: "
PRIOR_PLACEHOLDER = "{{prior_results}}"
EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# The user's date as the system prompt gives it (orchestration/engine/prompts.py user_local_time).
LOCAL_DATE_RE = re.compile(r"^The user's local time: \w+ (\d{4}-\d{2}-\d{2}) ", re.M)
TIME_RE = re.compile(r"\b(?:at\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm)\b|\bat\s+(\d{1,2}):(\d{2})\b", re.I)


class OfflineProvider:
    name = "offline"

    def complete(self, *, model: str, messages: list[dict], tools: list[dict],
                 max_tokens: int | None = None) -> LLMResponse:
        names = {tool["function"]["name"] for tool in tools}
        if "use_skill" in names:
            response = _agent_reply(messages)
        else:
            response = _orchestrator_reply(messages)
        text = json.dumps(messages)
        usage = Usage(prompt_tokens=len(text) // 4, completion_tokens=len(json.dumps(response.to_json())) // 4)
        if max_tokens is not None and usage.completion_tokens > max_tokens:
            return _cut(response, usage, max_tokens)
        return LLMResponse(response.content, response.tool_calls, "stop", usage, OFFLINE_MODEL)

    async def acomplete(self, *, model: str, messages: list[dict], tools: list[dict], on_text=None,
                        max_tokens: int | None = None) -> LLMResponse:
        # instant: nothing to stream
        return self.complete(model=model, messages=messages, tools=tools, max_tokens=max_tokens)


def _cut(response: LLMResponse, usage: Usage, max_tokens: int) -> LLMResponse:
    """An answer longer than `max_tokens`, stopped there as a provider stops it: its text
    cut (four characters a token), no tool call (none was finished), "length"."""
    return LLMResponse(response.content[:4 * max_tokens], [], "length",
                       Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=max_tokens), OFFLINE_MODEL)


# --- orchestrator side -------------------------------------------------------------------


def _orchestrator_reply(messages: list[dict]) -> LLMResponse:
    start = max(i for i, m in enumerate(messages) if m["role"] == "user" and not m["content"].startswith("[engine"))
    request = messages[start]["content"]
    turn = messages[start + 1 :]
    called = [c["function"]["name"] for m in turn if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    last = called[-1] if called else None
    if last in (None, "get_skill"):
        plan = plan_agents(request, today=_local_date(messages))
        if not plan:
            return LLMResponse(f"{BANNER}\n\n{_help_text()}")
        return _calls([("dispatch_agent", spec) for spec in plan])
    if last == "dispatch_agent":
        return _calls([("get_agent_results", {})])
    results = next((json.loads(m["content"]) for m in reversed(turn) if m["role"] == "tool"), {})
    return LLMResponse(_answer(results))


def _calls(calls: list[tuple[str, dict]]) -> LLMResponse:
    return LLMResponse(
        "",
        [ToolCall(id=f"offline_{i}_{name}", name=name, arguments=json.dumps(args)) for i, (name, args) in enumerate(calls)],
    )


def _answer(results: dict) -> str:
    lines = [BANNER, ""]
    for agent in results.get("agents", []):
        result = (agent.get("result") or "").strip()
        lines.append(f"- **{agent['agent_id']}** ({agent['status']}): {result}")
    if "error" in results:
        lines.append(f"Something went wrong: {results['error']}")
    return "\n".join(lines)


# Requests this planner can plan: the help text's examples, and the suggestions an empty
# conversation offers (so each works without a model too).
EXAMPLE_REQUESTS = (
    "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm",
    "add a task: renew passport",
    "remember that the wifi password is on the fridge",
    "what do you remember about wifi",
    "list my files",
)


def _help_text() -> str:
    quoted = [f'"{example}"' for example in EXAMPLE_REQUESTS]
    return f"I did not recognise a request I can plan offline. Try for example: {', '.join(quoted[:-1])}, or {quoted[-1]}."


def _local_date(messages: list[dict]) -> date | None:
    """The user's date, read from the system prompt as a real model would: "tomorrow"
    is the user's tomorrow, not the server's or UTC's."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    match = LOCAL_DATE_RE.search(system)
    return date.fromisoformat(match.group(1)) if match else None


def plan_agents(request: str, *, today: date | None = None) -> list[dict]:
    """From the user's words to dispatch_agent arguments, with dependencies. `today` is
    the user's date (default: the server's)."""
    text = request.lower()
    emails = EMAIL_RE.findall(request)
    plan: list[dict] = []
    search = None
    if re.search(r"\b(tasks?|to-?dos?)\b", text) and not re.search(r"\badd (a )?task\b", text):
        overdue = "overdue" in text
        search = "find-tasks"
        plan.append(_spec(search, f"Find my {'overdue' if overdue else 'open'} tasks.", "tasks.search",
                          {"status": "open", "overdue": True} if overdue else {"status": "open"}))
    if match := re.search(r"\badd (?:a )?task:?\s*(.+?)(?:[.,;]|$)", request, re.I):
        plan.append(_spec("add-task", "Create a task.", "tasks.create", {"title": match.group(1).strip()[:200]}))
    deps = [search] if search else []
    if emails and re.search(r"\b(e-?mail|mail|send)\b", text):
        subject = "Overdue tasks" if "overdue" in text else "A note from your assistant"
        plan.append(_spec("send-email", f"Email {', '.join(emails)}.", "email.send",
                          {"to": emails[:5], "subject": subject, "body": PRIOR_PLACEHOLDER if deps else request[:2000]},
                          depends_on=deps))
    if re.search(r"\b(meeting|book|schedule|calendar|appointment)\b", text):
        title = "Review meeting" if "review" in text else "Meeting"
        arguments = {"title": title, "start": _when(text, today or timezone.localdate()).isoformat(),
                     "duration_minutes": 30}
        if emails:
            arguments["invitees"] = emails[:5]
        plan.append(_spec("book-meeting", f"Book '{title}'.", "calendar.create_event", arguments, depends_on=deps))
    if match := re.search(r"\bremember(?: that)?\s+(.+)", request, re.I):
        if not re.search(r"what do you remember", text):
            plan.append(_spec("save-memory", "Save a memory.", "memory.save", {"text": match.group(1).strip()[:1000]}))
    if match := re.search(r"what do you (?:remember|know) about\s+(.+?)[?.!]*$", request, re.I):
        plan.append(_spec("recall", "Search my memories.", "memory.search", {"query": match.group(1).strip()[:200]}))
    if re.search(r"\b(list|show) (?:my )?files\b", text):
        plan.append(_spec("list-files", "List my files.", "files.list", {}))
    return plan


def _spec(agent_id: str, mission: str, skill: str, arguments: dict, depends_on: list[str] | None = None) -> dict:
    spec = {"agent_id": agent_id, "mission": mission, "skills": [skill],
            "context": PLAN_MARKER + json.dumps({"skill": skill, "arguments": arguments})}
    if depends_on:
        spec["depends_on"] = depends_on
    return spec


def _when(text: str, today: date) -> datetime:
    """A naive local time, as a model writes one: the calendar skill reads it in the
    user's zone (skills/executor.py)."""
    day = today + timedelta(days=1 if "tomorrow" in text else 0)
    hour, minute = 9, 0
    if match := TIME_RE.search(text):
        if match.group(1):
            hour, minute = int(match.group(1)) % 12, int(match.group(2) or 0)
            if match.group(3).lower() == "pm":
                hour += 12
        else:
            hour, minute = int(match.group(4)), int(match.group(5))
    return datetime.combine(day, time(hour % 24, minute % 60))


# --- agent side ----------------------------------------------------------------------------


def _agent_reply(messages: list[dict]) -> LLMResponse:
    task = messages[1]["content"] if len(messages) > 1 else ""
    results = [m for m in messages if m["role"] == "tool"]
    if results:
        return LLMResponse(_report(results))
    planned = [line[len(PLAN_MARKER):] for line in task.splitlines() if line.startswith(PLAN_MARKER)]
    if not planned:
        return LLMResponse("Offline agent: no planned call in my context, so nothing was done.")
    prior = task.split("Results from prior agents:\n", 1)[1] if "Results from prior agents:\n" in task else ""
    calls = []
    for index, raw in enumerate(planned):
        call = json.loads(raw.replace(json.dumps(PRIOR_PLACEHOLDER), json.dumps(prior or "(no prior results)")))
        calls.append(ToolCall(id=f"offline_skill_{index}", name="use_skill", arguments=json.dumps(call)))
    return LLMResponse("", calls)


def _report(results: list[dict]) -> str:
    parts = []
    for message in results:
        try:
            data = json.loads(message["content"])
        except json.JSONDecodeError:
            data = {"ok": False, "error": message["content"]}
        if data.get("ok"):
            parts.append(_humanize(data.get("result")))
        elif data.get("kind") == "denied":  # the error speaks to a model; this to the owner
            parts.append("Not done: you declined it.")
        else:
            parts.append(f"Failed: {data.get('error', 'unknown error')}")
    return "\n".join(parts)


def _humanize(result) -> str:
    if isinstance(result, dict):
        for key, item in result.items():  # one record: "email", "event", "task", ...
            if isinstance(item, dict):
                line = f"{key} #{item.get('id', '?')}: {_one_line(item)}"
                if result.get("overlaps"):
                    count = len(result["overlaps"])
                    line += f" — overlaps {count} other event{'s' if count != 1 else ''}"
                return line
        for key, items in result.items():  # a search: "tasks", "events", ...
            if isinstance(items, list) and all(isinstance(item, dict) for item in items):
                if not items:
                    return f"No {key} found."
                rows = [_one_line(item) for item in items[:20]]
                return f"{len(items)} {key}:\n" + "\n".join(f"  - {row}" for row in rows)
    return json.dumps(result, default=str)[:1500]


def _one_line(item) -> str:
    if not isinstance(item, dict):
        return str(item)
    label = item.get("title") or item.get("subject") or item.get("text") or item.get("name") or item.get("path") or ""
    extras = [f"{k}: {when_words(item[k]) if k in ('due', 'start') else _plain(item[k])}"
              for k in ("due", "start", "to", "status") if item.get(k)]
    return f"{label} ({'; '.join(str(e) for e in extras)})" if extras else str(label)


def _plain(value) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
