"""What trace export costs a turn: the same turns run with OpenTelemetry export off and
on, end to end in this process (the offline planner, tasks inline), and CPU and SQL
statements per model call compared; with export on, the spans go through the real
OTLP/HTTP exporter to a receiver on 127.0.0.1 that this benchmark starts.

Export runs once per run of a turn (at a pause and at the end), never per step: "on"
should cost a few tenths of a millisecond and about one statement per model call more
than "off", and "off" nothing at all (one settings read per run)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.backends.utils import CursorWrapper
from django.test.utils import override_settings
from django_q.conf import Conf

from orchestration.lifecycle.turns import turn_start
from orchestration.models import Conversation, LLMCall
from orchestration.reports import otel

PROMPT = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"
QUIET = {"ASSISTANT_LLM_PROVIDER": "offline", "ASSISTANT_SKILL_POLICIES": {"email.send": "allow"}}


@contextmanager
def receiver():
    """An OTLP/HTTP endpoint that accepts and counts what it is sent."""
    received = {"posts": 0, "bytes": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            received["bytes"] += len(self.rfile.read(int(self.headers["Content-Length"])))
            received["posts"] += 1
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()


def run_turns(user, count: int, *, export: bool) -> dict:
    egress = {**settings.ASSISTANT_EGRESS, "ask_new_recipients": False}
    with override_settings(ASSISTANT_OTEL_TRACES=export, ASSISTANT_EGRESS=egress, **QUIET), \
            mock.patch.object(Conf, "SYNC", True):
        turns, cpu, wall = [], time.process_time(), time.perf_counter()
        with statements_counted() as statements:
            for n in range(count):
                conversation = Conversation.objects.create(owner=user, title=f"trace cost {n}")
                turns.append(turn_start(conversation=conversation, text=PROMPT))
            if export:
                otel.tracer_provider().force_flush()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    calls = LLMCall.objects.filter(turn__in=turns).count()
    row = {"export": "on" if export else "off", "turns": count, "model_calls": calls,
           "cpu_ms_per_call": 1000 * cpu / calls, "queries_per_call": statements() / calls,
           "wall_ms_per_turn": 1000 * wall / count}
    if export:  # and the export alone, again, for the same turns: what "on" adds, without the turns' noise
        cpu = time.process_time()
        with statements_counted() as statements:
            for turn in turns:
                otel.turn_export(turn.pk, provider=otel.tracer_provider())
            otel.tracer_provider().force_flush()
        row |= {"export_cpu_ms_per_call": 1000 * (time.process_time() - cpu) / calls,
                "export_queries_per_turn": statements() / count}
    return row


@contextmanager
def statements_counted():
    """Count the SQL statements of every thread (the engine's run on its thread pools,
    each with its own connection): `yield`s a function that reads the count."""
    counted = itertools.count()
    execute = CursorWrapper._execute

    def counting(self, *args, **kwargs):
        next(counted)
        return execute(self, *args, **kwargs)

    with mock.patch.object(CursorWrapper, "_execute", counting):
        seen = []
        yield lambda: seen[0]
        seen.append(next(counted))


def measure(count: int, rounds: int, progress=print) -> list[dict]:
    user, _ = get_user_model().objects.get_or_create(username="trace-cost-bench")
    rows = []
    with receiver() as (url, received):
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = url
        os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "100")
        run_turns(user, 2, export=False)  # warm: imports, caches, the planner
        run_turns(user, 2, export=True)
        for n in range(rounds):
            for export in (False, True):  # interleaved, so drift falls on both
                rows.append(run_turns(user, count, export=export))
                progress(f"  round {n + 1}/{rounds}, export {'on' if export else 'off'}: "
                         f"{rows[-1]['cpu_ms_per_call']:.2f} ms CPU per model call")
        rows.append({"received": dict(received)})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| export | turns | model calls | CPU per model call | statements per model call | wall per turn "
             "| the export alone, per model call |",
             "|---|---|---|---|---|---|---|"]
    by_mode: dict[str, list[dict]] = {}
    for row in rows:
        if "export" in row:
            by_mode.setdefault(row["export"], []).append(row)
    for mode, mine in by_mode.items():
        cpu = sorted(r["cpu_ms_per_call"] for r in mine)
        lines.append(f"| {mode} | {sum(r['turns'] for r in mine)} | {sum(r['model_calls'] for r in mine)} | "
                     f"{cpu[len(cpu) // 2]:.2f} ms (median of {len(cpu)}; {cpu[0]:.2f}–{cpu[-1]:.2f}) | "
                     f"{sum(r['queries_per_call'] for r in mine) / len(mine):.2f} | "
                     f"{sum(r['wall_ms_per_turn'] for r in mine) / len(mine):.0f} ms | {_alone(mine)} |")
    return "\n".join(lines)


def _alone(rows: list[dict]) -> str:
    if "export_cpu_ms_per_call" not in rows[0]:
        return "–"
    cpu = sorted(r["export_cpu_ms_per_call"] for r in rows)
    queries = sum(r["export_queries_per_turn"] for r in rows) / len(rows)
    return f"{cpu[len(cpu) // 2]:.2f} ms CPU, {queries:.0f} statements a turn"
