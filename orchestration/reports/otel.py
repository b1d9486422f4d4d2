"""Each ended turn as one OpenTelemetry trace, sent with the OTLP exporter.

Off unless the standard variables ask for it (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and OTEL_TRACES_EXPORTER not "none": read at start
into settings.ASSISTANT_OTEL_TRACES); then a turn's
spans (orchestration/reports/traces.py) are built from its records once it has ended,
after its transaction commits, and handed to the SDK's batch processor, which sends them
from its own thread. Nothing runs per step: off or on, a step costs the same.

The exporter reads the rest of its configuration (headers, protocol, timeouts) from the
standard OTEL_* variables itself; OTEL_SERVICE_NAME names the service ("assistant").
"""

from __future__ import annotations

import logging
import os
import threading

from django.conf import settings

from orchestration.reports.traces import CLIENT, Span, turn_trace

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


def turn_export(turn_id: int, provider=None) -> None:
    """Send the ended turn `turn_id` as one trace. A failure is logged, never raised: a
    tracing backend that is down must not fail a turn."""
    from orchestration.models import Turn

    try:
        root = turn_trace(Turn.objects.get(pk=turn_id))
        emit(root, (provider or tracer_provider()).get_tracer("assistant.orchestration"))
    except Exception:  # noqa: BLE001 - see above
        logger.exception("Could not export turn %s as a trace", turn_id)


def after_ending(turn_id: int) -> None:
    """Called in the transaction that ends a turn: export it once that commits."""
    if settings.ASSISTANT_OTEL_TRACES:
        from django.db import transaction

        transaction.on_commit(lambda: turn_export(turn_id))


def emit(span: Span, tracer, parent=None) -> None:
    """Start and end `span` at its recorded times, under `parent`, then its children."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    started = tracer.start_span(span.name, context=parent, kind=SpanKind.CLIENT if span.kind == CLIENT
                                else SpanKind.INTERNAL, attributes=span.attributes, start_time=_ns(span.start))
    if span.error:
        started.set_attribute("error.type", span.error)
        started.set_status(Status(StatusCode.ERROR))
    context = trace.set_span_in_context(started)
    for child in span.children:
        emit(child, tracer, context)
    started.end(end_time=_ns(span.end))


def _ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)
