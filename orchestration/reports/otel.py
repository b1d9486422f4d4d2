"""Each turn as one OpenTelemetry trace, sent run by run with the OTLP exporter.

Off unless the standard variables ask for it (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and OTEL_TRACES_EXPORTER not "none": read at start
into settings.ASSISTANT_OTEL_TRACES); then a turn's spans (orchestration/reports/
traces.py) are built from its records once a run of it has ended (at a pause, or with
the turn), after that transaction commits, and handed to the SDK's batch processor,
which sends them from its own thread. The GenAI client metrics (operation duration,
token usage) are recorded from the same spans, when OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT
asks (settings.ASSISTANT_OTEL_METRICS). Nothing runs per step: off or on, a step costs
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
_meters = None
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


def meter_provider():
    """The process's meter provider: the OTLP/HTTP metric exporter, read periodically."""
    global _meters
    with _lock:
        if _meters is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import \
                OTLPMetricExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import \
                PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource

            _meters = MeterProvider(
                resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "assistant"}),
                metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
        return _meters


def turn_export(turn_id: int, provider=None, *, runs: str = "all", meters=None) -> None:
    """Send the turn `turn_id`'s runs in its one trace: "all", or "ended", the run that
    just ended (at a pause, or with the turn; nothing if the turn ended while paused: that
    run went at its pause). `provider`/`meters`: the tracer and meter providers (by
    default those the settings ask for; None sends no spans, or records no metrics). A
    failure is logged, never raised: a backend that is down must not fail a turn."""
    from orchestration.models import Turn

    try:
        turn = Turn.objects.get(pk=turn_id)
        roots = turn_trace(turn)
        if runs == "ended":
            roots = roots[-1:] if roots and (turn.status == "paused") == (run_ended_by(roots[-1]) == PAUSED) else []
        if provider is not None:
            tracer = _keyed_tracer(provider.get_tracer("assistant.orchestration"), turn)
            for root in roots:
                emit(root, tracer)
        if meters is not None:
            calls_measure(roots, meters.get_meter("assistant.orchestration"))
    except Exception:  # noqa: BLE001 - see above
        logger.exception("Could not export turn %s", turn_id)


# The GenAI conventions' advised buckets for the client metrics.
TOKEN_BUCKETS = [4 ** n for n in range(14)]
SECONDS_BUCKETS = [0.01 * 2 ** n for n in range(14)]


def calls_measure(roots: list[Span], meter) -> None:
    """The GenAI client metrics of the runs' model calls (failed attempts included):
    gen_ai.client.operation.duration and gen_ai.client.token.usage."""
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s",
                                      description="GenAI operation duration",
                                      explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
    usage = meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                                   description="Number of input and output tokens used",
                                   explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
    for root in roots:
        for _, span in root.walk():
            if span.kind != CLIENT:
                continue
            attributes = {name: span.attributes[name] for name in (
                "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model")
                if span.attributes.get(name)}
            if span.error:
                attributes["error.type"] = span.error
            duration.record((span.end - span.start).total_seconds(), attributes)
            for kind, name in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens")):
                if name in span.attributes:
                    usage.record(span.attributes[name], attributes | {"gen_ai.token.type": kind})


def after_ending(turn_id: int) -> None:
    """Called in the transaction that ends a turn: export its last run once that commits."""
    _after_commit(turn_id)


def after_pausing(turn_id: int) -> None:
    """Called in the transaction that pauses a turn: the run that ended goes now, not
    when (or if) the owner answers."""
    _after_commit(turn_id)


def _after_commit(turn_id: int) -> None:
    if settings.ASSISTANT_OTEL_TRACES or settings.ASSISTANT_OTEL_METRICS:
        from django.db import transaction

        transaction.on_commit(lambda: turn_export(
            turn_id, runs="ended", provider=tracer_provider() if settings.ASSISTANT_OTEL_TRACES else None,
            meters=meter_provider() if settings.ASSISTANT_OTEL_METRICS else None))


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
    for event in span.events:
        started.add_event(event.name, event.attributes, timestamp=_ns(event.at))
    if span.error:
        started.set_attribute("error.type", span.error)
        started.set_status(Status(StatusCode.ERROR))
    context = trace.set_span_in_context(started)
    for child in span.children:
        emit(child, tracer, context)
    started.end(end_time=_ns(span.end))


def _ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)
