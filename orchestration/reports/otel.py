"""Each turn as one OpenTelemetry trace, sent run by run with the OTLP exporter.

Off unless the standard variables ask for it (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and OTEL_TRACES_EXPORTER not "none": read at start
into settings.ASSISTANT_OTEL_TRACES); then a turn's spans (orchestration/reports/
traces.py) are built from its records once a run of it has ended (at a pause, or with
the turn), after that transaction commits, and handed to the SDK's batch processor,
which sends them from its own thread. Nothing runs per step: off or on, a step costs
the same.

The exporter reads the rest of its configuration (headers, protocol, timeouts) from the
standard OTEL_* variables itself; OTEL_SERVICE_NAME names the service ("assistant").
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import threading

from django.conf import settings

from orchestration.reports.traces import (CLIENT, PAUSED, Span, run_ended_by,
                                          turn_trace)

logger = logging.getLogger(__name__)

_provider = None
_lock = threading.Lock()


def tracer_provider():
    """The process's provider: the OTLP/HTTP exporter behind a batch processor."""
    global _provider
    with _lock:
        if _provider is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import \
                OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(resource=Resource.create(
                {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "assistant"}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            _provider = provider
        return _provider


def turn_export(turn_id: int, provider=None, *, runs: str = "all") -> None:
    """Send the turn `turn_id`'s runs in its one trace: "all", or "ended", the run that
    just ended (at a pause, or with the turn; nothing if the turn ended while paused: that
    run went at its pause). A failure is logged, never raised: a tracing backend that is
    down must not fail a turn."""
    from orchestration.models import Turn

    try:
        turn = Turn.objects.get(pk=turn_id)
        roots = turn_trace(turn)
        if runs == "ended":
            roots = roots[-1:] if roots and (turn.status == "paused") == (run_ended_by(roots[-1]) == PAUSED) else []
        tracer = _keyed_tracer((provider or tracer_provider()).get_tracer("assistant.orchestration"), turn)
        for root in roots:
            emit(root, tracer)
    except Exception:  # noqa: BLE001 - see above
        logger.exception("Could not export turn %s as a trace", turn_id)


def after_ending(turn_id: int) -> None:
    """Called in the transaction that ends a turn: export its last run once that commits."""
    _after_commit(turn_id)


def after_pausing(turn_id: int) -> None:
    """Called in the transaction that pauses a turn: the run that ended goes now, not
    when (or if) the owner answers."""
    _after_commit(turn_id)


def _after_commit(turn_id: int) -> None:
    if settings.ASSISTANT_OTEL_TRACES:
        from django.db import transaction

        transaction.on_commit(lambda: turn_export(turn_id, runs="ended"))


class _KeyedIds:
    """The ids of a turn's spans, derived from the turn and each span's key (traces.py),
    so a run exported at a pause by one worker and the next, exported by another, are
    one trace whose links resolve."""

    def __init__(self, turn):
        self.seed = f"{turn.pk}:{turn.started_at.isoformat()}"
        self.trace_id = _hashed(f"trace:{self.seed}", 128)
        self.key = ""

    def span_id(self, key: str) -> int:
        return _hashed(f"span:{self.seed}:{key}", 64)

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id(self.key)

    def is_trace_id_random(self) -> bool:
        return False


def _hashed(text: str, bits: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:bits // 8], "big") or 1


def _keyed_tracer(tracer, turn):
    """The SDK's tracer with the turn's keyed ids (a copy: the provider's stays random)."""
    keyed = copy.copy(tracer)
    keyed.id_generator = _KeyedIds(turn)
    return keyed


def emit(span: Span, tracer, parent=None) -> None:
    """Start and end `span` at its recorded times, under `parent`, then its children."""
    from opentelemetry import trace
    from opentelemetry.trace import (Link, SpanContext, SpanKind, Status,
                                     StatusCode, TraceFlags)

    ids = tracer.id_generator
    ids.key = span.key
    links = [Link(SpanContext(ids.trace_id, ids.span_id(key), is_remote=False, trace_flags=TraceFlags.SAMPLED))
             for key in span.links]
    started = tracer.start_span(span.name, context=parent, kind=SpanKind.CLIENT if span.kind == CLIENT
                                else SpanKind.INTERNAL, attributes=span.attributes, links=links,
                                start_time=_ns(span.start))
    if span.error:
        started.set_attribute("error.type", span.error)
        started.set_status(Status(StatusCode.ERROR))
    context = trace.set_span_in_context(started)
    for child in span.children:
        emit(child, tracer, context)
    started.end(end_time=_ns(span.end))


def _ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)
