"""The `ratelimited` workload (issue 26): a burst of fan-out turns against a provider that
enforces requests and tokens per minute, and one more user's question in its middle.

The scripted server enforces `RateLimit(rpm=RPM, tpm=…)` for the benchmark's API key (a
token bucket each, two seconds' worth of burst; tokens charged on arrival as OpenAI does:
the prompt at 4 characters a token plus `max_tokens`, or DEFAULT_MAX_TOKENS when the
request sends none; see tests/support/llm_server.py). The token limit is set from a
`wide` turn measured on the same server just before (`limits_for`): BURST_USERS such
turns need DEMAND times what the limit allows in a minute, so a perfect limiter takes
about DEMAND minutes over the burst, and the requests limit (RPM) binds less. The
qcluster gets the same limits as ASSISTANT_PROVIDER_LIMITS, so the engine may hold its
calls to them (one without a limiter ignores it): the same run measures either.

One run: the extra user's question alone first (UNLOADED_ASKS times, fresh buckets: its
unloaded time), then, with the buckets full again, BURST_USERS users each send a `wide`
turn at once; EXTRA_AFTER_SECONDS later the extra user asks its one-agent question, and
asks again (a new conversation, EXTRA_PAUSE_SECONDS after each answer) until the burst
is over. Reported: the 429s the engine got (and their share of its requests), the
tokens and requests per minute admitted over the burst against the limits, the agents
and turns that failed, and the extra user's time to answer (turn start → finish) under
the burst, p50/p95, against its unloaded time.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model

from benchmarks.load import latency_figures
from benchmarks.workloads import Workload, wide
from benchmarks.workloads import _agent as scripted_agent
from orchestration.lifecycle.turns import turn_start
from orchestration.models import AgentDispatch, Conversation, DispatchOutcome, Turn, TurnStatus
from tests.support.llm_server import RateLimit, Reply, ScriptedLLM, asked_of, request_tokens, user_text

NAME = "ratelimited"
BURST_USERS = 20
DEMAND = 2.0  # the burst's tokens ÷ the tokens per minute allowed
RPM = 600  # the burst's 560 requests fit in a minute: the token limit binds
DEFAULT_MAX_TOKENS = 1024  # the output allowance charged for a request without max_tokens
UNLOADED_ASKS = 3
EXTRA_AFTER_SECONDS = 3.0  # the burst's agents are all dispatched by then
EXTRA_PAUSE_SECONDS = 1.0
MAX_EXTRA_ASKS = 10
TIMEOUT_SECONDS = 900.0

BURST = wide()
EXTRA = Workload("one", (scripted_agent("q0"),))  # one agent, two skill calls: 7 model calls
FAILED_OUTCOMES = (DispatchOutcome.FAILED, DispatchOutcome.TIMEOUT)
FINAL = (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.STOPPED, TurnStatus.PAUSED)


@dataclass
class Result:
    workload: str
    setup: str
    latency_ms: int
    workers: int
    clusters: int
    limits: dict  # {"rpm", "tpm", "burst_requests", "burst_tokens", "default_max_tokens"}
    demand_tokens: int  # the burst's tokens, as the provider charges them (calibrated)
    requests: int  # the engine's requests to the provider during the burst (the extra user's too)
    rate_limited: int  # of those, answered 429
    rate_limited_pct: float
    tokens_per_minute: float  # admitted, over the burst (first request → last answer)
    tokens_per_minute_pct: float  # of the limit
    requests_per_minute: float
    burst_seconds: float  # the burst's turns: first start → last finish
    ideal_seconds: float  # a perfect limiter: the demand less the bucket, at the token rate
    turns: int
    turns_completed: int
    turns_failed: int
    turns_with_failed_agents: int
    agents_planned: int  # had every orchestrator dispatched its agents
    agents: int  # dispatched
    agents_failed: int  # outcome failed or timeout
    agent_outcomes: dict  # outcome → agents
    extra_unloaded_ms: dict  # the extra user's time to answer alone: latency_figures
    extra_loaded_ms: dict  # … during the burst (its questions answered; a failed one is counted below)
    extra_loaded_vs_unloaded: float  # p50 loaded ÷ p50 unloaded
    extra_turns_failed: int
    extra_unloaded_s: list  # the samples, seconds
    extra_loaded_s: list
    sdk_retries_in_env: int = 2
    runs: int = 1  # more: the pooled figures of that many runs (`pooled`)

    def as_dict(self) -> dict:
        return asdict(self)


class Script:
    """The burst's turns follow BURST's plan, the extra user's EXTRA's (told apart by the
    user's words, which agents' missions carry)."""

    def __init__(self):
        self.plans = {"run": BURST.plan(), "ask": EXTRA.plan()}

    def __call__(self, request: dict) -> Reply:
        is_agent = "use_skill" in {tool["function"]["name"] for tool in request.get("tools", [])}
        words = asked_of(request) if is_agent else user_text(request)
        return self.plans["ask" if words.startswith("ask ") else "run"](request)


@dataclass
class Limits:
    rpm: int
    tpm: int
    demand_tokens: int
    burst_requests: float = field(init=False)
    burst_tokens: float = field(init=False)

    def __post_init__(self):
        self.burst_requests, self.burst_tokens = self.rpm / 30, self.tpm / 30

    def rate_limit(self) -> RateLimit:
        return RateLimit(rpm=self.rpm, tpm=self.tpm, default_max_tokens=DEFAULT_MAX_TOKENS)

    def env(self) -> dict[str, str]:
        """ASSISTANT_PROVIDER_LIMITS for the qcluster: the same limits for every model the
        engine calls (the scripted server counts them together, per key)."""
        models = {settings.ASSISTANT_ORCHESTRATOR_MODEL, settings.ASSISTANT_AGENT_MODEL}
        return {"ASSISTANT_PROVIDER_LIMITS": json.dumps({m: {"rpm": self.rpm, "tpm": self.tpm} for m in sorted(models)})}

    def as_dict(self) -> dict:
        return {"rpm": self.rpm, "tpm": self.tpm, "burst_requests": self.burst_requests,
                "burst_tokens": self.burst_tokens, "default_max_tokens": DEFAULT_MAX_TOKENS}


def limits_for(server: ScriptedLLM, since: int) -> Limits:
    """The limits from one `wide` turn's requests (`server.requests[since:]`): BURST_USERS
    of them need DEMAND minutes of the token limit."""
    per_turn = sum(request_tokens(request, DEFAULT_MAX_TOKENS) for request in server.requests[since:])
    demand = per_turn * BURST_USERS
    return Limits(rpm=RPM, tpm=int(round(demand / DEMAND, -3)), demand_tokens=demand)


def run_ratelimited(*, server: ScriptedLLM, limits: Limits, latency_ms: int, clusters: list, setup: str,
                    workers: int) -> Result:
    server.respond, server.latency = Script(), latency_ms / 1000
    extra_user = bench_user(BURST_USERS)
    server.rate_limit = limits.rate_limit()
    unloaded = [s for s in (_answer_seconds(_ask(extra_user, wait=True)) for _ in range(UNLOADED_ASKS)) if s is not None]
    if len(unloaded) < UNLOADED_ASKS:
        raise RuntimeError(f"{NAME}: the extra user's question failed with no load: {clusters[0].log_tail()}")

    server.rate_limit = limits.rate_limit()  # full buckets for the burst
    since = len(server.requests)
    users = [bench_user(i) for i in range(BURST_USERS)]
    conversations = [Conversation.objects.create(owner=user, title=f"bench {NAME}") for user in users]
    started = time.monotonic()
    burst = [turn_start(conversation=c, text=f"run {NAME} #{c.pk}").pk for c in conversations]
    extra: list[int] = []
    asking: int | None = None
    next_ask = started + EXTRA_AFTER_SECONDS
    deadline = started + TIMEOUT_SECONDS
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{NAME}: turns unfinished after {TIMEOUT_SECONDS}s\n{clusters[0].log_tail()}")
        burst_over = not Turn.objects.filter(pk__in=burst).exclude(status__in=FINAL).exists()
        if asking is not None and Turn.objects.filter(pk=asking, status__in=FINAL).exists():
            extra.append(asking)
            asking, next_ask = None, time.monotonic() + EXTRA_PAUSE_SECONDS
        if asking is None and not burst_over and time.monotonic() >= next_ask and len(extra) < MAX_EXTRA_ASKS:
            asking = _ask(extra_user, wait=False)
        if burst_over and asking is None:
            break
        time.sleep(0.1)

    answers = [a for a in server.answers if a.index >= since]
    admitted = [a for a in answers if a.status != 429]
    window = max(a.answered for a in answers) - min(a.arrived for a in answers)
    refused = sum(a.status == 429 for a in answers)
    tokens = sum(a.tokens for a in admitted)
    done = list(Turn.objects.filter(pk__in=burst))
    dispatches = AgentDispatch.objects.filter(turn_id__in=burst)
    failed = dispatches.filter(outcome__in=FAILED_OUTCOMES)
    loaded = [s for s in map(_answer_seconds, extra) if s is not None]  # a failed turn gave no answer
    unloaded_figures, loaded_figures = latency_figures(unloaded), latency_figures(loaded)
    tpm = tokens / window * 60
    return Result(
        workload=NAME, setup=setup, latency_ms=latency_ms, workers=workers, clusters=len(clusters),
        limits=limits.as_dict(), demand_tokens=limits.demand_tokens,
        requests=len(answers), rate_limited=refused, rate_limited_pct=round(100 * refused / max(len(answers), 1), 1),
        tokens_per_minute=round(tpm), tokens_per_minute_pct=round(100 * tpm / limits.tpm, 1),
        requests_per_minute=round(len(admitted) / window * 60, 1),
        burst_seconds=round((max(t.finished_at for t in done) - min(t.started_at for t in done)).total_seconds(), 1),
        ideal_seconds=round(max(limits.demand_tokens - limits.burst_tokens, 0) / limits.tpm * 60, 1),
        turns=len(done), turns_completed=sum(t.status == TurnStatus.COMPLETED for t in done),
        turns_failed=sum(t.status == TurnStatus.FAILED for t in done),
        turns_with_failed_agents=failed.values("turn_id").distinct().count(),
        agents_planned=BURST_USERS * len(BURST.agents), agents=dispatches.count(), agents_failed=failed.count(),
        agent_outcomes=dict(Counter(dispatches.values_list("outcome", flat=True))),
        extra_unloaded_ms=unloaded_figures, extra_loaded_ms=loaded_figures,
        extra_loaded_vs_unloaded=round(loaded_figures["p50"] / unloaded_figures["p50"], 2) if loaded else 0.0,
        extra_turns_failed=sum(t.status != TurnStatus.COMPLETED for t in Turn.objects.filter(pk__in=extra)),
        extra_unloaded_s=[round(s, 3) for s in unloaded], extra_loaded_s=[round(s, 3) for s in loaded],
    )


SUMMED = ("requests", "rate_limited", "turns", "turns_completed", "turns_failed", "turns_with_failed_agents",
          "agents_planned", "agents", "agents_failed", "extra_turns_failed")


def pooled(runs: list[dict]) -> dict:
    """Several runs as one row: counts summed, rates averaged, the extra user's samples pooled."""
    merged = {**runs[0], "runs": len(runs), **{name: sum(r[name] for r in runs) for name in SUMMED}}
    for name in ("tokens_per_minute", "tokens_per_minute_pct", "requests_per_minute", "burst_seconds"):
        merged[name] = round(sum(r[name] for r in runs) / len(runs), 1)
    merged["rate_limited_pct"] = round(100 * merged["rate_limited"] / max(merged["requests"], 1), 1)
    merged["agent_outcomes"] = dict(sum((Counter(r["agent_outcomes"]) for r in runs), Counter()))
    for name in ("extra_unloaded", "extra_loaded"):
        merged[f"{name}_s"] = [s for r in runs for s in r[f"{name}_s"]]
        merged[f"{name}_ms"] = latency_figures(merged[f"{name}_s"])
    loaded, alone = merged["extra_loaded_ms"], merged["extra_unloaded_ms"]
    merged["extra_loaded_vs_unloaded"] = round(loaded["p50"] / alone["p50"], 2) if loaded.get("n") else 0.0
    return merged


def bench_user(index: int):
    user, _ = get_user_model().objects.get_or_create(username=f"bench-{index:02d}")
    return user


def _ask(user, *, wait: bool) -> int:
    """The extra user's one-agent question, in a new conversation: the turn's pk (once
    it is final, if `wait`)."""
    conversation = Conversation.objects.create(owner=user, title=f"bench {NAME} extra")
    turn = turn_start(conversation=conversation, text=f"ask one #{conversation.pk}")
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while wait and not Turn.objects.filter(pk=turn.pk, status__in=FINAL).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{NAME}: the extra question unanswered after {TIMEOUT_SECONDS}s")
        time.sleep(0.05)
    return turn.pk


def _answer_seconds(turn_pk: int) -> float | None:
    """Start → finish of a completed turn (None for one that failed: it gave no answer)."""
    turn = Turn.objects.get(pk=turn_pk)
    return (turn.finished_at - turn.started_at).total_seconds() if turn.status == TurnStatus.COMPLETED else None


def table(results: list[dict]) -> str:
    head = (f"{'runs':>4} {'qc':>2} {'L ms':>5} {'TPM limit':>9} {'demand':>6} {'requests':>8} {'429s':>11} "
            f"{'TPM admitted':>17} {'burst s':>7} {'ideal s':>7} {'agents failed/dispatched/planned':>31} {'turns failed':>12} "
            f"{'extra p50/p95 s (alone)':>27}")
    rows = [f"{NAME}: {BURST_USERS} users' wide turns at once against RPM/TPM limits, and one more user's question",
            head, "-" * len(head)]
    for r in results:
        extra, alone = r["extra_loaded_ms"], r["extra_unloaded_ms"]
        agents = f"{r['agents_failed']}/{r['agents']}/{r['agents_planned']}"
        loaded = f"{extra['p50'] / 1000:.1f}/{extra['p95'] / 1000:.1f}" if extra.get("n") else "–"
        rows.append(
            f"{r.get('runs', 1):>4} {r['clusters']:>2} {r['latency_ms']:>5} {r['limits']['tpm']:>9} "
            f"{r['demand_tokens'] / r['limits']['tpm']:>5.1f}× {r['requests']:>8} "
            f"{r['rate_limited']:>5} ({r['rate_limited_pct']:>3.0f}%) "
            f"{round(r['tokens_per_minute']):>9} ({r['tokens_per_minute_pct']:>3.0f}%) {r['burst_seconds']:>7.1f} "
            f"{r['ideal_seconds']:>7.1f} {agents:>31} "
            f"{r['turns_failed']:>5}/{r['turns']:<3} ({r['turns_with_failed_agents']})"
            f" {loaded:>11} ×{r['extra_loaded_vs_unloaded']:<4} ({alone['p50'] / 1000:.1f}) n={extra.get('n', 0)}"
            f"{' failed ' + str(r['extra_turns_failed']) if r['extra_turns_failed'] else ''}")
    rows.append("turns failed: failed/all (in brackets: turns with a failed agent); extra: the extra user's "
                "time to answer during the burst, × its p50 alone (its p50 alone), its samples, its failed turns")
    return "\n".join(rows)
