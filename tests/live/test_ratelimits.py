"""A provider's rate limits, shared by every worker (issue 26): real qclusters against the
scripted server enforcing them (tests/support/llm_server.py: `RateLimit`, `max_in_flight`).

Every test here needs the engine's shared rate limiter (marker `limiter`): without it,
each worker calls as soon as it is ready and retries on its own, and these fail (the
failure each shows on an engine without one is in its docstring). `-m "not limiter"`
leaves them out.

The two qclusters stand in for two machines: same database, same queue, same API key;
each sends its own OpenAI-Project header (OPENAI_PROJECT_ID, which the SDK sends), so
the server's timeline (`llm.answers`) tells their requests apart.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from orchestration.lifecycle.turns import turn_start
from orchestration.models import AgentDispatch, DispatchOutcome, Turn
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.test_qcluster import SEARCH, turn_done
from tests.support.llm_server import Agent, Plan, RateLimit, http_error

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MODEL = "gpt-4o-mini"  # the default model of the orchestrator and the agents
PROJECTS = ("cluster-a", "cluster-b")
# The limiter's concurrency cap for the endpoint, as the limiter's settings are to name it.
CONCURRENCY_ONE = {"ASSISTANT_PROVIDER_CONCURRENCY": "1"}
CALL_SECONDS = 6  # ASSISTANT_LLM_TIMEOUT_SECONDS: how long a reserved slot may be held (no SDK retries)
GRACE_SECONDS = 8.0  # the other cluster's next look, and its step to the request, on a busy CI machine (4 s failed)


def fan_out(agents: int, calls: int = 1) -> Plan:
    """Each turn dispatches `agents` agents at once, each making `calls` skill calls (one a
    model answer) before its report; the user's words in every mission tell turns apart."""
    return Plan([Agent(f"w{i}", ["tasks.search"], [SEARCH] * calls, report=f"w{i}: done") for i in range(agents)],
                answer="All done.", tag_missions=True)


def two_clusters(qcluster, env: dict[str, str] | None = None, *, workers: int = 1, in_flight: int = 4) -> list:
    """Each with `in_flight` agents and steps at once (ASSISTANT_AGENTS_IN_FLIGHT): the
    first started would otherwise take a whole burst, and the second have nothing to wait for."""
    return [qcluster(workers=workers, env={"OPENAI_PROJECT_ID": project, "ASSISTANT_AGENTS_IN_FLIGHT": str(in_flight),
                                           **(env or {})}) for project in PROJECTS]


def limits_env(rpm: int, tpm: int) -> dict[str, str]:
    return {"ASSISTANT_PROVIDER_LIMITS": json.dumps({MODEL: {"rpm": rpm, "tpm": tpm}})}


def start_turns(users, count: int) -> list[Turn]:
    """`count` turns at once, spread over the users (a turn each in its own conversation)."""
    return [turn_start(conversation=conversation_for(users[i % len(users)]), text=f"burst #{i}") for i in range(count)]


def wait_all(turns: list[Turn], clusters: list, *, timeout: float) -> None:
    wait_for(lambda: all(turn_done(turn) for turn in turns), timeout=timeout,
             what=f"{len(turns)} turns to finish", cluster=clusters[0])


def failed_agents(turns: list[Turn]) -> list[tuple[str, str]]:
    """(agent, its error or outcome) of every agent that did not complete, errors first."""
    found = [(d.agent_id, d.error or d.outcome) for d in AgentDispatch.objects.filter(turn__in=turns)
             if d.outcome != DispatchOutcome.COMPLETED]
    return sorted(found, key=lambda failed: failed[1] in DispatchOutcome.values)


def test_two_qclusters_share_one_limit_a_burst_finishes_without_failures_or_429s(llm, qcluster, alice, bob):
    """Eight turns of four agents at once, 96 model calls of some 1,700 tokens each (as the
    server charges them: 1,024 of them the output allowance) against 600 requests and
    600,000 tokens a minute (10 requests and 10,000 tokens a second, two seconds' worth at
    once): the burst, two seconds' work unthrottled, takes some 15 s. No agent fails and
    (under 1 % of 96) no request gets a 429.

    On an engine without a shared limiter: every worker sends at once, past the buckets
    the server answers 429 (most requests), and agents fail with "LLM rate limit: Error
    code: 429" after their retries."""
    rpm, tpm = 600, 600_000
    llm.respond, llm.latency = fan_out(4), 0.3
    clusters = two_clusters(qcluster, limits_env(rpm, tpm))
    llm.rate_limit = RateLimit(rpm=rpm, tpm=tpm)
    since = len(llm.requests)
    turns = start_turns([alice, bob], 8)
    wait_all(turns, clusters, timeout=40)

    answers = [a for a in llm.answers if a.index >= since]
    refused = [a for a in answers if a.status == 429]
    failed = failed_agents(turns)
    assert not failed, f"{len(failed)} agents failed, the first: {failed[0]}"
    assert [t.status for t in Turn.objects.filter(pk__in=[t.pk for t in turns])] == ["completed"] * 8
    assert len(refused) < 0.01 * len(answers), f"{len(refused)} of {len(answers)} requests got a 429"
    assert {a.project for a in answers} == set(PROJECTS), "both clusters worked on the burst"
    demand = sum(a.tokens for a in answers)
    assert demand > 3 * tpm / 30, "the burst did not need more than the bucket holds: the limit was not exercised"


def test_a_429_with_retry_after_seen_by_one_worker_holds_every_worker(llm, qcluster, alice, bob):
    """Mid-burst, once both clusters have sent agents' requests, the server answers one
    request 429 with `Retry-After: 3`. From the moment that answer is sent (allowing
    RACE seconds for the word to reach the other workers: a request admitted before the
    hold was recorded is already on its way, and on a busy CI machine it has been seen to
    arrive 0.3 s after) until 3 s after, no request arrives from either cluster; then both
    go on, and no agent fails. No limit is configured: the provider's word alone holds
    the model.

    On an engine without a shared limiter: the other workers (and the one that got it,
    after its 0.1 s backoff) keep calling within the 3 s."""
    retry_after, race = 3.0, 0.6
    plan, lock = fan_out(4, calls=3), threading.Lock()
    refused: dict = {}

    def respond(request):
        with lock:
            seen = {a.project for a in llm.answers if a.status == 200}
            if not refused and seen == set(PROJECTS) and "use_skill" in json.dumps(request.get("tools", [])):
                refused["request"] = request
                return http_error(429, "Rate limit reached for gpt-4o-mini on requests per min (RPM).",
                                  headers={"retry-after": str(int(retry_after))})
        return plan(request)

    llm.respond, llm.latency = plan, 0.2
    clusters = two_clusters(qcluster)
    llm.respond = respond
    turns = start_turns([alice, bob], 4)
    wait_all(turns, clusters, timeout=40)

    (refusal,) = [a for a in llm.answers if a.status == 429]
    held = [(a.project, round(a.arrived - refusal.answered, 3)) for a in llm.answers
            if refusal.answered + race < a.arrived < refusal.answered + retry_after]
    assert held == [], f"requests within the Retry-After ({retry_after} s) of a 429 seen by {refusal.project}"
    after = {a.project for a in llm.answers if a.arrived >= refusal.answered + retry_after}
    assert after == set(PROJECTS), "both clusters had work waiting, and went on after the Retry-After"
    assert not failed_agents(turns)


def test_a_worker_killed_holding_capacity_does_not_hold_it_past_its_reservation(llm, qcluster, alice, bob):
    """The provider serves one request at a time (ASSISTANT_PROVIDER_CONCURRENCY=1, shared
    by both clusters, one worker each); a model call times out after CALL_SECONDS (and
    the SDK does not retry), so a slot is reserved for at most that long. Once both
    clusters have been served, the next agent's request hangs, and the worker that sent
    it is SIGKILLed at once, holding the only slot. Until the kill, no request was in
    flight beside another; after it, the other cluster's next request comes within
    CALL_SECONDS (and GRACE_SECONDS) of the kill.

    On an engine without a shared limiter: nothing caps the calls, several are in flight
    at once from the start ("N requests in flight at once under a concurrency of 1")."""
    plan, lock = fan_out(4, calls=3), threading.Lock()
    hanging: dict = {}

    def respond(request):
        reply = plan(request)
        with lock:
            seen = {a.project for a in llm.answers if a.status == 200}
            if not hanging and seen == set(PROJECTS) and "use_skill" in json.dumps(request.get("tools", [])):
                hanging.update(client=llm.client, arrived=time.time())
                reply.delay = 60
        return reply

    llm.respond, llm.latency = plan, 0.2
    env = {**CONCURRENCY_ONE, "ASSISTANT_LLM_TIMEOUT_SECONDS": str(CALL_SECONDS)}
    clusters = two_clusters(qcluster, env, in_flight=2)
    llm.respond, llm.peak_admitted = respond, 0
    turns = start_turns([alice, bob], 3)
    wait_for(lambda: hanging or all(turn_done(t) for t in turns), timeout=20, what="a request to hang",
             cluster=clusters[0])
    assert hanging, "the turns finished before both clusters were served"
    server_port = int(llm.url.rsplit(":", 1)[1].split("/")[0])
    cluster, worker = wait_for(
        lambda: next(((c, pid) for c in clusters if (pid := c.pid_of_connection(hanging["client"][1], server_port))),
                     None), timeout=5, what="the worker holding the slot")
    overlapping = [(index, project, round(arrived - hanging["arrived"], 3)) for index, project, arrived in llm.at_peak]
    assert llm.peak_admitted == 1, (f"{llm.peak_admitted} requests in flight at once under a concurrency of 1 "
                                    f"(index, cluster, arrived after the hang in s): {overlapping}")
    os.kill(worker, signal.SIGKILL)
    killed = time.time()
    other = PROJECTS[1 - clusters.index(cluster)]

    def next_from_the_other() -> float | None:
        return min((a.arrived for a in llm.answers if a.project == other and a.arrived > killed), default=None)

    arrived = wait_for(next_from_the_other, timeout=CALL_SECONDS + GRACE_SECONDS,
                       what=f"{other}'s next request after the kill", cluster=clusters[0])
    assert arrived - killed <= CALL_SECONDS + GRACE_SECONDS
