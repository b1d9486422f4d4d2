"""Run a workload through a real qcluster and measure it (see workloads.py for the ideal)."""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django_q.conf import Conf

from orchestration.bench.listen import SocketListener
from orchestration.bench.llm_server import ScriptedLLM
from orchestration.bench.load import Daphne, cpu_seconds, latency_figures, peak_rss_mb, services_cpu
from orchestration.bench.processes import Cluster
from orchestration.bench.workloads import Workload, wide
from orchestration.models import AgentDispatch, Conversation, Event, SkillExecution, Turn, TurnStatus
from orchestration.turns import turn_start

FINAL = (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.STOPPED, TurnStatus.PAUSED)
SOCKET_SETTLE_SECONDS = 20.0  # after the last turn, for the sockets to have every event


@dataclass
class Result:
    workload: str
    setup: str
    latency_ms: int
    workers: int
    makespan_s: float
    ideal_s: float
    ratio: float
    llm_requests: int
    expected_llm_requests: int
    cpu_s_per_llm_call: float  # daphne and the qcluster's processes
    cpu_s: dict  # by process: web, workers, the benchmark itself (LLM server, sockets), services
    peak_rss_mb: dict
    event_latency_ms: dict  # commit → the dashboard's socket (median, p95)
    sockets_equal_to_database: int
    turns_completed: int
    turns: int
    ratio_of_each_run: list = field(default_factory=list)  # the reported run is the median

    def as_dict(self) -> dict:
        return asdict(self)


def run_workload(*, workload: Workload, latency_ms: int, server: ScriptedLLM, cluster: Cluster, web: Daphne,
                 setup: str, workers: int, timeout: float = 300) -> Result:
    """One run: the workload's conversations, each with its dashboard socket open from
    before the message until every event has arrived (then closed, as a page is left)."""
    listener = SocketListener(web.url)
    try:
        return _run(workload, latency_ms, server, cluster, web, listener, setup, workers, timeout)
    finally:
        listener.close()


def _run(workload, latency_ms, server, cluster, web, listener, setup, workers, timeout) -> Result:
    server.respond = workload.plan()
    server.latency = latency_ms / 1000
    requests_before = len(server.requests)
    cpu_before = _cpu(cluster, web)
    users = [_bench_user(i) for i in range(workload.conversations)]
    conversations = [Conversation.objects.create(owner=user, title=f"bench {workload.name}") for user in users]
    for conversation, user in zip(conversations, users):
        listener.watch(conversation.pk, user)  # the dashboard is open before the message is sent
    turns = [turn_start(conversation=c, text=f"run {workload.name}") for c in conversations]
    deadline = time.monotonic() + timeout
    while Turn.objects.filter(pk__in=[t.pk for t in turns]).exclude(status__in=FINAL).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{workload.name}: turns unfinished after {timeout}s\n{cluster.log_tail()}")
        time.sleep(0.1)  # the makespan comes from the turns' own timestamps, not from this loop
    events = _events_by_conversation(conversations)
    listener.wait_for({cid: set(ids) for cid, ids in events.items()}, timeout=SOCKET_SETTLE_SECONDS)
    cpu = {name: round(after - cpu_before[name], 2) for name, after in _cpu(cluster, web).items()}
    done = list(Turn.objects.filter(pk__in=[t.pk for t in turns]))
    makespan = (max(t.finished_at for t in done) - min(t.started_at for t in done)).total_seconds()
    ideal = statistics.mean(workload.ideal_seconds(latency_ms / 1000, _skill_seconds(t)) for t in done)
    requests = len(server.requests) - requests_before
    latencies = [listener.arrivals[cid][event_id] - created for cid, created_by_id in events.items()
                 for event_id, created in created_by_id.items() if event_id in listener.arrivals[cid]]
    peaks = {"web (daphne)": peak_rss_mb(web), "worker (largest qcluster process)": peak_rss_mb(cluster)}
    return Result(
        workload=workload.name, setup=setup, latency_ms=latency_ms, workers=workers,
        makespan_s=round(makespan, 3), ideal_s=round(ideal, 3), ratio=round(makespan / ideal, 3),
        llm_requests=requests, expected_llm_requests=workload.expected_llm_requests,
        cpu_s_per_llm_call=round((cpu["web"] + cpu["workers"]) / max(requests, 1), 4), cpu_s=cpu,
        peak_rss_mb=peaks, event_latency_ms=latency_figures(latencies),
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


def _cpu(cluster: Cluster, web: Daphne) -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"web": cpu_seconds(web), "workers": cpu_seconds(cluster),
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


def queries_per_agent_step(*, server: ScriptedLLM, agents: int) -> float:
    """SQL queries per sub-agent LLM step, run inline (django-q2 sync) in this process.

    Inline, a task enqueued by another runs nested inside it; each query is counted for
    the innermost task only, so an agent is not charged for the orchestrator it wakes.
    """
    from orchestration import tasks

    workload = wide(agents)
    server.respond, server.latency = workload.plan(), 0
    running: list[str] = []
    counted = {"agent": 0}

    def count(execute, sql, params, many, context):
        if running and running[-1] == "agent":
            counted["agent"] += 1
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
            conversation = Conversation.objects.create(owner=_bench_user(99), title="bench queries")
            turn = turn_start(conversation=conversation, text="count queries")
    finally:
        tasks.subagent_run, tasks.orchestrator_step, Conf.SYNC = originals
    steps = sum(AgentDispatch.objects.filter(turn=turn).values_list("llm_calls", flat=True))
    return round(counted["agent"] / max(steps, 1), 1)


def now_label() -> str:
    return timezone.now().strftime("%Y-%m-%d %H:%M UTC")
