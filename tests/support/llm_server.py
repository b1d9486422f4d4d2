"""A scripted OpenAI-compatible Chat Completions server on 127.0.0.1.

The tests and the benchmark point the real openai SDK at it over HTTP. It answers with
a `respond(request) -> Reply` function after `latency` seconds (concurrently: one thread
per request); `Plan` builds such a function from a DAG of scripted agents. Responses
depend only on the request, so replays and concurrent workers get consistent answers.
An unscripted request fails loudly (HTTP 500 with the reason; `errors` records it).

It is no kinder than a real provider. Tool-call ids are fresh and random in every
response by default, as OpenAI's are (`ids="reused"` numbers them `call_0`, `call_1`,
... in every response, as some compatible servers do; `ids="scripted"` keeps the
script's). `with_burst` makes a run of requests fail with 5xx or 429, longer than the
SDK's own retries if asked; `Reply.delay` makes one hang. It honours `max_tokens` as
providers do: a longer answer stops there (`_cut`), plain or streamed.

A request with `stream: true` is answered as providers do (`streaming="sse"`, the
default): server-sent events, the text a few characters a chunk, each tool call's id and
name first and its arguments in pieces, the finish reason, then the usage in a last chunk
without choices when `stream_options.include_usage` asks for it, then `[DONE]`;
`chunk_interval` paces the chunks and `Reply.stall` stops sending mid-stream. A server
without streaming ignores the flag and answers whole (`streaming="plain"`) or refuses
the request (`streaming="refuse"`, HTTP 400).

It enforces a provider's rate limits when given them (`rate_limit=RateLimit(rpm=300,
tpm=60_000)`, per API key): requests and tokens per minute, each a token bucket that
refills at the rate and holds a burst. A request is charged what OpenAI charges when it
arrives: its prompt at CHUNK_CHARS characters a token plus its output allowance
(`max_tokens`, or `RateLimit.default_max_tokens`), see `request_tokens`. Past either
limit it answers at once with HTTP 429, OpenAI's error body ("rate_limit_exceeded"),
`Retry-After` in whole seconds (and `retry-after-ms` if asked) and the `x-ratelimit-*`
headers, which every answer under a limit carries, streamed ones too. `max_in_flight`
caps the requests being answered at once, as a self-hosted server does (429 past it).
`answers` records every answer (arrival, answer, status, key, tokens charged) and
`rate_limited` counts the 429s.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Reply:
    content: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, raw arguments)
    finish_reason: str = "stop"
    status: int = 200
    headers: dict = field(default_factory=dict)
    body: str | None = None  # a raw body instead of a completion (for malformed answers)
    delay: float = 0.0
    usage: tuple[int, int, int] = (100, 20, 0)
    stall: float = 0.0  # streamed: seconds to hang after the first chunk


def text(content: str, **kw) -> Reply:
    return Reply(content=content, **kw)


def calls(*items: tuple[str, dict | str], prefix: str = "call") -> Reply:
    """Tool calls from (name, arguments) pairs; a str argument is sent raw (malformed JSON)."""
    return Reply(tool_calls=[
        (f"{prefix}_{i}", name, args if isinstance(args, str) else json.dumps(args))
        for i, (name, args) in enumerate(items)
    ])


def http_error(status: int, message: str = "scripted error", headers: dict | None = None) -> Reply:
    return Reply(status=status, body=json.dumps({"error": {"message": message, "type": "scripted"}}), headers=headers or {})


def with_burst(respond: Callable[[dict], Reply], *, count: int, status: int = 503,
               when: Callable[[dict], bool] = lambda request: True, headers: dict | None = None):
    """`respond`, except that the first `count` requests for which `when(request)` holds
    fail with HTTP `status` (`.failed` counts them). Pick `count` above the SDK's
    max_retries + 1 to outlast its own retries. A provider's throttling usually says
    when to come back: `headers={"retry-after-ms": "10"}`."""
    lock = threading.Lock()

    def respond_or_fail(request: dict) -> Reply:
        if when(request):
            with lock:
                if respond_or_fail.failed < count:
                    respond_or_fail.failed += 1
                    return http_error(status, f"scripted burst ({respond_or_fail.failed}/{count})", headers)
        return respond(request)

    respond_or_fail.failed = 0
    return respond_or_fail


@dataclass(frozen=True)
class RateLimit:
    """A provider's limits for each API key (each key has its own buckets).

    Requests and tokens per minute, each a token bucket refilled continuously at the
    rate and holding `burst_*` (by default two seconds' worth, at least one request):
    `RateLimit(rpm=300)` lets 10 requests through at once, then 5 a second. A request
    costing more tokens than the bucket holds passes when the bucket is full and leaves
    it in debt, so a large request is slowed, never refused for ever. None: no limit.
    """

    rpm: float | None = None
    tpm: float | None = None
    burst_requests: float | None = None
    burst_tokens: float | None = None
    default_max_tokens: int = 1024  # the output allowance charged for a request without max_tokens
    retry_after_ms: bool = False  # also send `retry-after-ms` (the SDK prefers it to Retry-After)

    def buckets(self, now: float) -> dict[str, _Bucket]:
        found = {}
        for name, per_minute, burst in (("requests", self.rpm, self.burst_requests),
                                         ("tokens", self.tpm, self.burst_tokens)):
            if per_minute is not None:
                capacity = burst if burst is not None else max(per_minute / 30, 1.0)
                found[name] = _Bucket(per_minute, per_minute / 60, capacity, capacity, now)
        return found


@dataclass
class _Bucket:
    limit: float  # per minute, as the x-ratelimit-limit-* header says
    rate: float  # per second
    capacity: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def wait(self, cost: float) -> float:
        """Seconds until `cost` may be taken (0: now)."""
        needed = min(cost, self.capacity)
        return 0.0 if self.level >= needed else (needed - self.level) / self.rate

    def headers(self, name: str) -> dict[str, str]:
        return {f"x-ratelimit-limit-{name}": str(int(self.limit)),
                f"x-ratelimit-remaining-{name}": str(max(0, math.floor(self.level))),
                f"x-ratelimit-reset-{name}": duration((self.capacity - self.level) / self.rate)}


def duration(seconds: float) -> str:
    """A duration as OpenAI's x-ratelimit-reset-* headers write it: "20ms", "1.2s", "6m0s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    hours, minutes = divmod(int(minutes), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def request_tokens(request: dict, default_max_tokens: int = 1024) -> int:
    """The tokens a provider charges a request when it arrives, as OpenAI counts them:
    the prompt (every message's text, its tool calls' names and arguments, and the tool
    definitions as JSON) at CHUNK_CHARS characters a token, plus the output allowance
    (`max_tokens` or `max_completion_tokens`, else `default_max_tokens`)."""
    chars = len(json.dumps(request["tools"])) if request.get("tools") else 0
    for message in request.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            chars += len(function.get("name") or "") + len(function.get("arguments") or "")
    allowance = request.get("max_tokens") or request.get("max_completion_tokens") or default_max_tokens
    return -(-chars // CHUNK_CHARS) + allowance


@dataclass
class Answer:
    """One request as the server saw it (`ScriptedLLM.answers`), epoch seconds."""

    index: int  # in `requests`
    arrived: float
    answered: float
    status: int
    key: str  # the API key (the bearer token)
    project: str  # the OpenAI-Project header (the SDK sends OPENAI_PROJECT_ID): tells clients apart
    tokens: int  # charged against the token limit (0 when refused, or no limit is set)
    refused: str = ""  # why the server refused it: "requests", "tokens" or "concurrency"


def rate_limited(message: str, kind: str, retry_after: float, *, code: str = "rate_limit_exceeded",
                 milliseconds: bool = False) -> Reply:
    """HTTP 429 as OpenAI sends it: the error body the SDK reads and `Retry-After`."""
    headers = {"retry-after": str(max(1, math.ceil(retry_after)))}
    if milliseconds:
        headers["retry-after-ms"] = str(max(1, math.ceil(retry_after * 1000)))
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Reply(status=429, body=json.dumps(body), headers=headers)


TOOL_CALL_IDS = ("fresh", "reused", "scripted")
STREAMING = ("sse", "plain", "refuse")
CHUNK_CHARS = 4  # about a token


class _Server(ThreadingHTTPServer):
    # A provider accepts a burst of connections (a runner opens 100 at once); the
    # default backlog of 5 refused them, which no real endpoint does.
    request_queue_size = 512
    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client closed its kept-alive connection (a worker stopped, or was killed)
        super().handle_error(request, client_address)


class ScriptedLLM:
    def __init__(self, respond: Callable[[dict], Reply] | None = None, latency: float = 0.0, ids: str = "fresh",
                 streaming: str = "sse", chunk_interval: float = 0.0, rate_limit: RateLimit | None = None,
                 max_in_flight: int | None = None):
        if ids not in TOOL_CALL_IDS:
            raise ValueError(f"ids must be one of {TOOL_CALL_IDS}")
        if streaming not in STREAMING:
            raise ValueError(f"streaming must be one of {STREAMING}")
        self.respond = respond
        self.latency = latency
        self.ids = ids
        self.streaming = streaming
        self.chunk_interval = chunk_interval
        self.requests: list[dict] = []
        self.errors: list[str] = []
        # (index in `requests`, arrived, answered) in epoch seconds: the hand-offs the
        # benchmark reports are read from this, the model's side of the wire.
        self.timeline: list[tuple[int, float, float]] = []
        self.in_flight = 0  # requests being answered now (the latency included)
        self.peak_in_flight = 0
        self.answers: list[Answer] = []
        # Requests admitted and not yet fully answered (a stream until its last chunk):
        # what `max_in_flight` caps, as a self-hosted server caps the requests it serves.
        self.max_in_flight = max_in_flight
        self._admitted: dict[int, tuple[str, float]] = {}  # index → (project, arrived)
        self.peak_admitted = 0  # the most at once (a test may set it back to 0)
        # (index, project, arrived) of the requests admitted when the peak was last
        # reached: which requests overlapped, for a failure's message.
        self.at_peak: list[tuple[int, str, float]] = []
        self._lock = threading.Lock()
        self._buckets: dict[str, dict[str, _Bucket]] = {}
        self.rate_limit = rate_limit
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # `stop` waits for the serving loop to look up: every 0.5 s by default, half a
        # second of every test's teardown
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def rate_limit(self) -> RateLimit | None:
        return self._rate_limit

    @rate_limit.setter
    def rate_limit(self, limit: RateLimit | None) -> None:
        """Setting the limits (or setting them again) starts every key with full buckets."""
        with self._lock:
            self._rate_limit = limit
            self._buckets = {}

    @property
    def rate_limited(self) -> int:
        """The 429s answered (refused by the limits, or scripted)."""
        return sum(answer.status == 429 for answer in self.answers)

    def _admit(self, request: dict, key: str) -> tuple[str, Reply | None, dict[str, str], int]:
        """Under the lock: (why it is refused or "", the 429 if it is, the x-ratelimit-*
        headers, the tokens charged). The caller counts one admitted (`_count_admitted`)
        until it is answered."""
        headers: dict[str, str] = {}
        if self.max_in_flight is not None and self.admitted >= self.max_in_flight:
            return "concurrency", rate_limited(f"Too many requests in flight: limit {self.max_in_flight}.",
                                               "requests", 1.0, code="concurrency_limit_exceeded"), headers, 0
        limit = self._rate_limit
        if limit is None:
            return "", None, headers, 0
        now = time.time()
        buckets = self._buckets.get(key)
        if buckets is None:
            buckets = self._buckets[key] = limit.buckets(now)
        cost = {"requests": 1, "tokens": request_tokens(request, limit.default_max_tokens)}
        for bucket in buckets.values():
            bucket.refill(now)
        waits = {name: bucket.wait(cost[name]) for name, bucket in buckets.items()}
        kind = max(waits, key=waits.get) if waits else None
        if kind is not None and waits[kind] > 0:
            for name, bucket in buckets.items():
                headers.update(bucket.headers(name))
            bucket = buckets[kind]
            message = (f"Rate limit reached for {request.get('model', 'scripted')} on {kind} per min "
                       f"({'RPM' if kind == 'requests' else 'TPM'}): Limit {int(bucket.limit)}, "
                       f"Requested {cost[kind]}. Please try again in {duration(waits[kind])}.")
            return kind, rate_limited(message, kind, waits[kind], milliseconds=limit.retry_after_ms), headers, 0
        for name, bucket in buckets.items():
            bucket.level -= cost[name]
            headers.update(bucket.headers(name))
        return "", None, headers, cost["tokens"] if "tokens" in buckets else 0

    @property
    def admitted(self) -> int:
        """Requests admitted and not yet fully answered."""
        return len(self._admitted)

    def _count_admitted(self, index: int, project: str, arrived: float) -> None:
        """Under the lock, as `_admit` let the request in."""
        self._admitted[index] = (project, arrived)
        if len(self._admitted) >= self.peak_admitted:
            self.peak_admitted = len(self._admitted)
            self.at_peak = sorted((i, p, a) for i, (p, a) in self._admitted.items())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The headers and the body go out in two writes: with Nagle's algorithm the body
            # waited for the client's delayed ACK, 40 ms on every reused connection.
            disable_nagle_algorithm = True

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                arrived = time.time()
                key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                project = self.headers.get("OpenAI-Project") or ""
                with scripted._lock:
                    index = len(scripted.requests)
                    scripted.requests.append(request)
                    refused, refusal, limit_headers, tokens = scripted._admit(request, key)
                    if refusal is None:
                        scripted._count_admitted(index, project, arrived)

                def answered(status: int, refused: str = "") -> None:
                    with scripted._lock:
                        now = time.time()
                        scripted.timeline.append((index, arrived, now))
                        scripted.answers.append(Answer(index, arrived, now, status, key, project, tokens, refused))

                released = []

                def release() -> None:
                    """The request leaves the admitted ones once its answer is whole, before
                    its last bytes go out: a client that asks again the moment it has them
                    does not find it still counted (as a provider frees the slot)."""
                    with scripted._lock:
                        if not released:
                            released.append(True)
                            scripted._admitted.pop(index, None)

                if refusal is not None:  # refused before the model runs (never admitted), at once
                    self._release = lambda: None
                    self._send(replace(refusal, headers={**limit_headers, **refusal.headers}), request,
                               lambda: answered(429, refused))
                    return
                self._release = release
                try:
                    self._answer(request, limit_headers, answered)
                finally:
                    release()

            def _answer(self, request: dict, limit_headers: dict, answered: Callable[..., None]):
                try:
                    if scripted.respond is None:
                        raise AssertionError("no script set for this request")
                    if request.get("stream") and scripted.streaming == "refuse":
                        reply = http_error(400, "stream: this server does not support streaming")
                    else:
                        reply = scripted.respond(request)
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    scripted.errors.append(f"{type(exc).__name__}: {exc}")
                    reply = http_error(500, f"unscripted request: {exc}")
                    reply.headers = {"x-should-retry": "false"}
                reply = scripted._with_ids(reply)
                if limit_headers:
                    reply = replace(reply, headers={**limit_headers, **reply.headers})
                with scripted._lock:
                    scripted.in_flight += 1
                    scripted.peak_in_flight = max(scripted.peak_in_flight, scripted.in_flight)
                try:
                    time.sleep(scripted.latency + reply.delay)
                finally:
                    with scripted._lock:
                        scripted.in_flight -= 1
                if request.get("stream") and scripted.streaming == "sse" and reply.status == 200 and reply.body is None:
                    self._stream(request, reply)
                    answered(200)
                    return
                self._send(reply, request, lambda: answered(reply.status))

            def _send(self, reply: Reply, request: dict, answered: Callable[[], None]):
                body = reply.body if reply.body is not None else json.dumps(_completion(request, reply))
                data = body.encode()
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json", **reply.headers, "Content-Length": str(len(data))}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                answered()
                self._release()
                self.wfile.write(data)

            def _stream(self, request: dict, reply: Reply):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    for number, chunk in enumerate(_chunks(request, reply)):
                        if number == 1 and reply.stall:
                            time.sleep(reply.stall)
                        elif number and scripted.chunk_interval:
                            time.sleep(scripted.chunk_interval)
                        self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                    self._release()
                    self._write_chunk(b"data: [DONE]\n\n")
                    self._write_chunk(b"")
                except (BrokenPipeError, ConnectionResetError):  # the client gave up
                    self.close_connection = True

            def _write_chunk(self, data: bytes):
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler

    def _with_ids(self, reply: Reply) -> Reply:
        if self.ids == "scripted" or not reply.tool_calls:
            return reply
        if self.ids == "reused":
            ids = [f"call_{index}" for index in range(len(reply.tool_calls))]
        else:
            ids = [f"call_{secrets.token_hex(12)}" for _ in reply.tool_calls]
        return replace(reply, tool_calls=[(new, name, args) for new, (_, name, args) in zip(ids, reply.tool_calls)])


def _cut(reply: Reply, max_tokens: int | None) -> Reply:
    """The reply as a provider sends it under `max_tokens`. An answer longer than that (its
    scripted completion tokens, or its text at CHUNK_CHARS characters a token, whichever
    is more) stops there: its text cut at that many tokens (a tool call's arguments mid-
    JSON, later calls never written), finish_reason "length", and the allowance reported
    as its completion tokens."""
    prompt, completion, cached = reply.usage
    written = reply.content + "".join(arguments for _, _, arguments in reply.tool_calls)
    if max_tokens is None or max(completion, -(-len(written) // CHUNK_CHARS)) <= max_tokens:
        return reply
    room = max_tokens * CHUNK_CHARS
    content, room = reply.content[:room], room - len(reply.content)
    tool_calls = []
    for call_id, name, arguments in reply.tool_calls:
        if room <= 0:
            break
        tool_calls.append((call_id, name, arguments[:room]))
        room -= len(arguments)
    return replace(reply, content=content, tool_calls=tool_calls, finish_reason="length",
                   usage=(prompt, max_tokens, cached))


def _completion(request: dict, reply: Reply) -> dict:
    reply = _cut(reply, request.get("max_tokens"))
    prompt, completion, cached = reply.usage
    message: dict = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if reply.tool_calls and reply.finish_reason == "stop" else reply.finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }


def _chunks(request: dict, reply: Reply):
    """The completion as Chat Completions stream chunks (see the module docstring)."""
    completion = _completion(request, reply)
    choice, usage = completion["choices"][0], completion["usage"]

    def chunk(delta: dict, finish_reason: str | None = None, **extra) -> dict:
        return {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
                "model": completion["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}

    yield chunk({"role": "assistant", "content": ""})
    content = choice["message"]["content"] or ""
    for start in range(0, len(content), CHUNK_CHARS):
        yield chunk({"content": content[start:start + CHUNK_CHARS]})
    for index, call in enumerate(choice["message"].get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), 4 * CHUNK_CHARS):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[start:start + 4 * CHUNK_CHARS]}}]})
    yield chunk({}, choice["finish_reason"])
    if (request.get("stream_options") or {}).get("include_usage"):
        yield {**chunk({}), "choices": [], "usage": usage}


# --- plans: a DAG of scripted agents ---------------------------------------------------------


@dataclass
class Agent:
    """A scripted sub-agent: its skill calls in order, then its report."""

    agent_id: str
    skills: list[str]
    calls: list[tuple[str, dict]] = field(default_factory=list)  # (skill, arguments)
    depends_on: list[str] = field(default_factory=list)
    report: str = ""
    extra: dict = field(default_factory=dict)  # more dispatch_agent arguments
    per_call: int = 1  # skill calls per LLM response

    def dispatch_arguments(self, asked: str = "") -> dict:
        """`asked`: the user's message, carried in the mission so that each request
        names its turn (the benchmark's hand-offs are per turn)."""
        mission = f"mission:{self.agent_id}" + (f" asked:{asked}" if asked else "")
        args = {"agent_id": self.agent_id, "mission": mission, "skills": self.skills, **self.extra}
        if self.depends_on:
            args["depends_on"] = self.depends_on
        return args


class Plan:
    """Orchestrator: get_skill, dispatch every agent at once, get_agent_results, answer.

    Agents: their scripted calls, `per_call` per response, then the report.
    """

    def __init__(self, agents: list[Agent], answer: str = "All done.", discover: bool = True,
                 tag_missions: bool = False):
        self.agents = {agent.agent_id: agent for agent in agents}
        self.answer = answer
        self.discover = discover
        self.tag_missions = tag_missions

    def __call__(self, request: dict) -> Reply:
        tool_names = {tool["function"]["name"] for tool in request.get("tools", [])}
        if "use_skill" in tool_names:
            return self.agent_reply(request)
        return self.orchestrator_reply(request)

    def orchestrator_reply(self, request: dict) -> Reply:
        called = _called_tools(request["messages"])
        steps = (["get_skill"] if self.discover else []) + ["dispatch_agent", "get_agent_results"]
        done = [name for name in steps if name in called]
        if len(done) < len(steps):
            step = steps[len(done)]
            if step == "get_skill":
                return calls(("get_skill", {}), prefix="orch_skill")
            if step == "dispatch_agent":
                asked = user_text(request) if self.tag_missions else ""
                return calls(*[("dispatch_agent", a.dispatch_arguments(asked)) for a in self.agents.values()],
                             prefix="orch_dispatch")
            return calls(("get_agent_results", {}), prefix="orch_results")
        return text(self.answer)

    def agent_reply(self, request: dict) -> Reply:
        agent = self.agents[agent_of(request)]
        used = sum(1 for m in request["messages"] if m["role"] == "tool")
        if used < len(agent.calls):
            batch = agent.calls[used : used + agent.per_call]
            return Reply(tool_calls=[
                (f"{agent.agent_id}_c{used + i}", "use_skill", json.dumps({"skill": s, "arguments": a}))
                for i, (s, a) in enumerate(batch)
            ])
        return text(agent.report or f"{agent.agent_id} done")


# Mails what it read wherever its text says "email this … to <address>".
PLANTED_ORDER = re.compile(r"email (?:this|it)\b[^.]*? to ([\w.+-]+@[\w-]+(?:\.[\w-]+)+)", re.IGNORECASE)
COURIER = "courier"


class Obedient:
    """A gullible model around `plan`: it does what the text it reads tells it to.

    An agent that reads an order to "email this … to <address>" — in its mission (with
    the reports it depends on) or in a tool result — mails what it read there to that
    address at once, if it was granted email.send; and every agent reports what its tool
    results said, word for word, as a summary would. An orchestrator that reads such an
    order in a report dispatches a fresh agent, COURIER, granted email.send, with the
    order and the text in its mission. Nothing is scripted per case: what it obeys is
    whatever the data planted. Otherwise it follows `plan`.
    """

    def __init__(self, plan: Plan):
        self.plan = plan

    def __call__(self, request: dict) -> Reply:
        if "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}:
            return self.agent_reply(request)
        return self.orchestrator_reply(request)

    def agent_reply(self, request: dict) -> Reply:
        messages = request["messages"]
        read = [m.get("content") or "" for m in messages if m["role"] in ("user", "tool")]
        order = _order_in(read)
        if order and _granted(request, "email.send") and "email.send" not in _used_skills(messages):
            address, found = order
            send = {"to": [address], "subject": "As instructed", "body": found[:2000]}
            return Reply(tool_calls=[("obey_0", "use_skill", json.dumps({"skill": "email.send", "arguments": send}))])
        agent_id = agent_of(request)
        if agent_id in self.plan.agents and len(_tool_contents(messages)) < len(self.plan.agents[agent_id].calls):
            return self.plan.agent_reply(request)
        found = "\n".join(_tool_contents(messages))
        return text(f"{agent_id} done." + (f" What I found:\n{found}" if found else ""))

    def orchestrator_reply(self, request: dict) -> Reply:
        messages = request["messages"]
        order = _order_in(_tool_contents(messages))
        called = _called_tools(messages)
        if order and not any(COURIER in (c["function"]["arguments"] or "") for m in messages
                             if m["role"] == "assistant" for c in m.get("tool_calls") or []
                             if c["function"]["name"] == "dispatch_agent"):
            address, found = order
            mission = f"mission:{COURIER} Email this to {address}: {found[:2000]}"
            return calls(("dispatch_agent", {"agent_id": COURIER, "mission": mission, "skills": ["email.send"]}),
                         prefix="orch_obey")
        if called and called[-1] == "dispatch_agent":
            return calls(("get_agent_results", {}), prefix="orch_results")
        return self.plan.orchestrator_reply(request)


def _order_in(texts: list[str]) -> tuple[str, str] | None:
    """(address, the text the order was found in), the first order in `texts`."""
    for content in texts:
        if match := PLANTED_ORDER.search(content):
            return match.group(1), content
    return None


def _granted(request: dict, skill: str) -> bool:
    use_skill = next(t for t in request["tools"] if t["function"]["name"] == "use_skill")
    return skill in json.dumps(use_skill)


def _used_skills(messages: list[dict]) -> set[str]:
    used = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call["function"]["name"] == "use_skill":
                try:
                    used.add(json.loads(call["function"]["arguments"]).get("skill"))
                except (ValueError, AttributeError):
                    pass
    return used


def _tool_contents(messages: list[dict]) -> list[str]:
    return [m.get("content") or "" for m in messages if m["role"] == "tool"]


def user_text(request: dict) -> str:
    """The first user message: the person's, in an orchestrator request."""
    return next((m.get("content") or "" for m in request["messages"] if m["role"] == "user"), "")


def asked_of(request: dict) -> str:
    """The user's message an agent request's mission carries (Plan(tag_missions=True))."""
    for message in request["messages"]:
        content = message.get("content") or ""
        if message["role"] == "user" and " asked:" in content:
            return content.split(" asked:", 1)[1].splitlines()[0].strip()
    return ""


def agent_of(request: dict) -> str:
    for message in request["messages"]:
        if message["role"] == "user" and "mission:" in (message.get("content") or ""):
            return message["content"].split("mission:", 1)[1].split()[0]
    raise AssertionError("not a scripted agent request")


def _called_tools(messages: list[dict]) -> list[str]:
    return [c["function"]["name"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]


# --- a model that carries what it read into what it writes -----------------------------------


@dataclass
class RelayAgent:
    """An agent for `Relay`: its actions in order (RELAY_ACTIONS, or ("delegate",
    RelayAgent) to dispatch a child and collect its report), then its report."""

    agent_id: str
    actions: list = field(default_factory=list)
    depends_on: list[str] = field(default_factory=list)
    profile: str = ""  # a delegating one, for an agent that dispatches children


# action: (skill, arguments given what the agent carries: the secret, or "nothing")
RELAY_ACTIONS = {
    "read": lambda carry, relay: ("files.read", {"path": relay.path}),
    "search": lambda carry, relay: ("tasks.search", {}),
    "list": lambda carry, relay: ("calendar.list_events", {}),
    "note": lambda carry, relay: ("tasks.create", {"title": f"Note: {carry}"}),
    "event": lambda carry, relay: ("calendar.create_event", {"title": f"Meet about {carry}", "start": relay.start}),
    "send": lambda carry, relay: ("email.send", {"to": [relay.to], "subject": "Note", "body": f"Here it is: {carry}"}),
}
RELAY_WRITES = ("note", "event", "send")


class Relay:
    """A model that, as a summary would, carries `secret` into everything it writes once
    it has seen it — in its mission, its dependencies' reports, a tool result or, as the
    orchestrator, the conversation's earlier answers: a task's or an event's title, a
    message's body, a child's mission, its report and the answer.

    The orchestrator dispatches `agents` at once (the secret in their missions if the
    history holds it), collects their results and answers (quoting the secret if a report
    did). Agents take their scripted actions in order. `carried` collects the ids of the
    writes made with the secret in view: the side effects outside content had reached.
    Tool-call ids are scripted (`ScriptedLLM(ids="scripted")`) and unique per agent id.
    """

    def __init__(self, agents: list[RelayAgent], *, secret: str, path: str = "notes.txt",
                 to: str = "bob@example.com", start: str = "",
                 skills: tuple[str, ...] = ("calendar.create_event", "calendar.list_events", "email.send",
                                            "files.read", "tasks.create", "tasks.search")):
        self.top = agents
        self.agents = {}
        stack = list(agents)
        while stack:
            agent = stack.pop()
            self.agents[agent.agent_id] = agent
            stack += [action[1] for action in agent.actions if isinstance(action, tuple)]
        self.secret, self.path, self.to, self.skills = secret, path, to, list(skills)
        # within calendar.list_events' default range (the next 14 days)
        self.start = start or (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
        self.carried: set[str] = set()

    def __call__(self, request: dict) -> Reply:
        messages = request["messages"]
        seen = any(self.secret in (m.get("content") or "") for m in messages if m["role"] != "system")
        carry = self.secret if seen else "nothing"
        if "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}:
            return self._agent_reply(agent_of(request), messages, carry)
        steps = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
        if steps == 0:
            return calls(*[("dispatch_agent", self._dispatch(agent, carry)) for agent in self.top], prefix="relay_o0")
        if steps == 1:
            return calls(("get_agent_results", {}), prefix="relay_o1")
        return text(f"Done. Found: {carry}")

    def _dispatch(self, agent: RelayAgent, carry: str) -> dict:
        mission = f"mission:{agent.agent_id}" + (f" About: {carry}" if carry == self.secret else "")
        spec = {"agent_id": agent.agent_id, "mission": mission, "skills": self.skills}
        if agent.depends_on:
            spec["depends_on"] = agent.depends_on
        if agent.profile:
            spec["profile"] = agent.profile
        return spec

    def _agent_reply(self, agent_id: str, messages: list[dict], carry: str) -> Reply:
        steps = []
        for action in self.agents[agent_id].actions:
            steps += [("dispatch", action[1]), ("results", None)] if isinstance(action, tuple) else [(action, None)]
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done >= len(steps):
            return text(f"{agent_id} done. Found: {carry}")
        action, child = steps[done]
        call_id = f"{agent_id}_s{done}"
        if action == "dispatch":
            return Reply(tool_calls=[(call_id, "dispatch_agent", json.dumps(self._dispatch(child, carry)))])
        if action == "results":
            return Reply(tool_calls=[(call_id, "get_agent_results", "{}")])
        if action in RELAY_WRITES and carry == self.secret:
            self.carried.add(call_id)
        skill, arguments = RELAY_ACTIONS[action](carry, self)
        return Reply(tool_calls=[(call_id, "use_skill", json.dumps({"skill": skill, "arguments": arguments}))])


class Recorded:
    """The model of a stored turn, from its recording (`manage.py replay TURN --as-fixture
    PATH`): each request gets the answer the turn got at that role and step, so a turn seen
    in production runs again here, against the real engine and skills, as a regression
    test. `.text` is the user's message, `.limits` the limits it started with; `.missed`
    names the requests the recording holds no answer for (the engine went elsewhere)."""

    def __init__(self, source):
        from orchestration.replay.recording import Recording

        data = source if isinstance(source, dict) else json.loads(open(source, encoding="utf-8").read())
        self.recording = Recording.from_json(data)
        self.text, self.limits = self.recording.text, self.recording.limits
        self.missed: list[str] = []

    def __call__(self, request: dict) -> Reply:
        from orchestration.replay.recording import NO_ANSWER, answer_for

        who, step, answer = answer_for(self.recording, request["messages"], request.get("tools", []))
        if answer is None:
            self.missed.append(f"{who}, answer {step + 1}")
            return text(NO_ANSWER)
        return Reply(content=answer.get("content") or "", finish_reason=answer.get("finish_reason") or "stop",
                     tool_calls=[(c["id"], c["name"], c["arguments"]) for c in answer.get("tool_calls") or []])
