"""Run a workload through real qclusters and measure it (see workloads.py for the bound)."""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django_q.conf import Conf

from benchmarks.handoffs import handoff_seconds
from benchmarks.listen import SocketListener
from benchmarks.load import Daphne, cpu_seconds, latency_figures, services_cpu
from benchmarks.workloads import Workload, wide
from orchestration.budgets.spending import spend_periods_start
from orchestration.lifecycle.turns import turn_start
from orchestration.models import AgentDispatch, Conversation, Event, SkillExecution, Turn, TurnStatus
from tests.support.llm_server import ScriptedLLM, agent_of
from tests.support.processes import Cluster, pss_mb
from tests.support.statements import CONTROL, NOT_THE_STEPS, TIME_BOUNDED

FINAL = (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.STOPPED, TurnStatus.PAUSED)
SOCKET_SETTLE_SECONDS = 20.0  # after the last turn, for the sockets to have every event


@dataclass
class Result:
    workload: str
    setup: str
    latency_ms: int
    workers: int
    clusters: int
    makespan_s: float
    bound_s: float
    ratio: float
    llm_requests: int
    expected_llm_requests: int
    peak_in_flight: int  # model requests being answered at once
    cpu_ms_per_llm_call: float  # the project's processes: daphne and every qcluster process
    postgres_cpu_ms_per_llm_call: float
    cpu_s: dict  # by process: web, workers, the benchmark itself (LLM server, sockets), services
    pss_mb: dict  # proportional set size at the end: web, workers (every qcluster process), total
    handoff_ms: dict  # hand-off → p50/p95 (benchmarks/handoffs.py)
    event_latency_ms: dict  # commit → the dashboard's socket (median, p95)
    sockets_equal_to_database: int
    turns_completed: int
    turns: int
    ratio_of_each_run: list = field(default_factory=list)  # the reported run is the median

    def as_dict(self) -> dict:
        return asdict(self)


def run_workload(*, workload: Workload, latency_ms: int, server: ScriptedLLM, clusters: list[Cluster],
                 web: Daphne, setup: str, workers: int, timeout: float = 300) -> Result:
    """One run: the workload's conversations, each with its dashboard socket open from
    before the message until every event has arrived (then closed, as a page is left)."""
    listener = SocketListener(web.url)
    try:
        return _run(workload, latency_ms, server, clusters, web, listener, setup, workers, timeout)
    finally:
        listener.close()


def _run(workload, latency_ms, server, clusters, web, listener, setup, workers, timeout) -> Result:
    server.respond = workload.plan()
    server.latency = latency_ms / 1000
    requests_before = len(server.requests)
    server.peak_in_flight = 0
    cpu_before = _cpu(clusters, web)
    users = [_bench_user(i) for i in range(workload.conversations)]
    conversations = [Conversation.objects.create(owner=user, title=f"bench {workload.name}") for user in users]
    for conversation, user in zip(conversations, users):
        listener.watch(conversation.pk, user)  # the dashboard is open before the message is sent
    # Each turn's own words: the model server's requests say which turn they are for.
    turns = [turn_start(conversation=c, text=f"run {workload.name} #{c.pk}") for c in conversations]
    deadline = time.monotonic() + timeout
    while Turn.objects.filter(pk__in=[t.pk for t in turns]).exclude(status__in=FINAL).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{workload.name}: turns unfinished after {timeout}s\n{clusters[0].log_tail()}")
        time.sleep(0.1)  # the makespan comes from the turns' own timestamps, not from this loop
    events = _events_by_conversation(conversations)
    listener.wait_for({cid: set(ids) for cid, ids in events.items()}, timeout=SOCKET_SETTLE_SECONDS)
    cpu = {name: round(after - cpu_before[name], 2) for name, after in _cpu(clusters, web).items()}
    done = list(Turn.objects.filter(pk__in=[t.pk for t in turns]))
    makespan = (max(t.finished_at for t in done) - min(t.started_at for t in done)).total_seconds()
    skills = {t.pk: _skill_seconds(t) for t in done}
    bound = statistics.mean(workload.bound_seconds(latency_ms / 1000, skills[t.pk]) for t in done)
    requests = len(server.requests) - requests_before
    latencies = [listener.arrivals[cid][event_id] - created for cid, created_by_id in events.items()
                 for event_id, created in created_by_id.items() if event_id in listener.arrivals[cid]]
    handoffs = handoff_seconds(server, requests_before, workload, {
        f"run {workload.name} #{t.conversation_id}": (t.started_at.timestamp(), skills[t.pk]) for t in done})
    workers_pss = round(sum(pss_mb(pid) for c in clusters for pid in [c.pid, *c.descendants()]), 1)
    web_pss = round(sum(pss_mb(pid) for pid in [web.pid, *web.descendants()]), 1)
    per_call = 1000 / max(requests, 1)
    return Result(
        workload=workload.name, setup=setup, latency_ms=latency_ms, workers=workers, clusters=len(clusters),
        makespan_s=round(makespan, 3), bound_s=round(bound, 3), ratio=round(makespan / bound, 3),
        llm_requests=requests, expected_llm_requests=workload.expected_llm_requests,
        peak_in_flight=server.peak_in_flight,
        cpu_ms_per_llm_call=round((cpu["web"] + cpu["workers"]) * per_call, 2),
        postgres_cpu_ms_per_llm_call=round(cpu["postgres"] * per_call, 2), cpu_s=cpu,
        pss_mb={"web": web_pss, "workers": workers_pss, "total": round(web_pss + workers_pss, 1)},
        handoff_ms={name: latency_figures(values) for name, values in handoffs.items()},
        event_latency_ms=latency_figures(latencies),
        sockets_equal_to_database=sum(listener.arrivals[cid].keys() == ids.keys() for cid, ids in events.items()),
        turns_completed=sum(t.status == TurnStatus.COMPLETED for t in done), turns=len(done),
    )


def median_run(runs: list[Result]) -> Result:
    """The run with the median ratio, noting every run's ratio: one turn on a shared
    2-core machine varies by ±10 % from run to run."""
    ordered = sorted(runs, key=lambda r: r.ratio)
    return replace(ordered[(len(ordered) - 1) // 2], ratio_of_each_run=[r.ratio for r in runs])


def _events_by_conversation(conversations: list[Conversation]) -> dict[int, dict[int, float]]:
    """conversation → event id → created_at (epoch seconds)."""
    found: dict[int, dict[int, float]] = {c.pk: {} for c in conversations}
    for event_id, conversation_id, created_at in Event.objects.filter(
            conversation__in=conversations).values_list("id", "conversation_id", "created_at"):
        found[conversation_id][event_id] = created_at.timestamp()
    return found


def _cpu(clusters: list[Cluster], web: Daphne) -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"web": cpu_seconds(web), "workers": sum(cpu_seconds(c) for c in clusters),
            "benchmark (LLM server, sockets)": usage.ru_utime + usage.ru_stime, **services_cpu()}


def _skill_seconds(turn: Turn) -> dict[str, float]:
    totals: dict[str, float] = {}
    for agent_id, duration in SkillExecution.objects.filter(dispatch__turn=turn).values_list(
        "dispatch__agent_id", "duration_ms"
    ):
        totals[agent_id] = totals.get(agent_id, 0.0) + (duration or 0) / 1000
    return totals


def _bench_user(index: int):
    user, _ = get_user_model().objects.get_or_create(username=f"bench-{index:02d}")
    return user


def queries_per_agent_step(*, server: ScriptedLLM, agents: int) -> tuple[float, float]:
    """SQL queries per sub-agent LLM step, run inline (django-q2 sync) in this process:
    (every query of the agents' deliveries, claims and ends included, per model call, but
    the reads a process makes every so often whatever its calls (`TIME_BOUNDED`);
    the engine's statements of a steady-state step, the median between two requests of
    one agent, without transaction control and the skill's own reads of its table).

    Inline, a task enqueued by another runs nested inside it; each query is counted for
    the innermost task only, so an agent is not charged for the orchestrator it wakes.
    """
    from orchestration.worker import tasks

    workload = wide(agents)
    plan = workload.plan()
    user = _bench_user(99)
    spend_periods_start(user=user, now=timezone.now())  # a day's first call is not a step
    server.latency = 0
    running: list[str] = []
    counted = {"agent": 0, "engine": 0}
    asked: dict[str, list[int]] = {}

    def respond(request: dict):
        if any(tool["function"]["name"] == "use_skill" for tool in request.get("tools", [])):
            asked.setdefault(agent_of(request), []).append(counted["engine"])
        return plan(request)

    server.respond = respond

    def count(execute, sql, params, many, context):
        if running and running[-1] == "agent":
            counted["agent"] += not TIME_BOUNDED.search(sql)
            counted["engine"] += not CONTROL.match(sql) and not NOT_THE_STEPS.search(sql)
        return execute(sql, params, many, context)

    def tagged(kind, task):
        def run(object_id):
            running.append(kind)
            try:
                task(object_id)
            finally:
                running.pop()
        return run

    originals = (tasks.subagent_run, tasks.orchestrator_step, Conf.SYNC)
    tasks.subagent_run = tagged("agent", tasks.subagent_run)
    tasks.orchestrator_step = tagged("orchestrator", tasks.orchestrator_step)
    Conf.SYNC = True
    try:
        with connection.execute_wrapper(count):
            conversation = Conversation.objects.create(owner=user, title="bench queries")
            turn = turn_start(conversation=conversation, text="count queries")
    finally:
        tasks.subagent_run, tasks.orchestrator_step, Conf.SYNC = originals
    steps = sum(AgentDispatch.objects.filter(turn=turn).values_list("llm_calls", flat=True))
    gaps = sorted(b - a for marks in asked.values() for a, b in zip(marks, marks[1:]))
    return round(counted["agent"] / max(steps, 1), 1), float(gaps[len(gaps) // 2]) if gaps else 0.0


def now_label() -> str:
    return timezone.now().strftime("%Y-%m-%d %H:%M UTC")
