"""An OTLP/HTTP receiver on 127.0.0.1, as a collector would be: it accepts what the
exporters post to /v1/traces and /v1/metrics (protobuf) and keeps it, decoded, for a
test to read. Started by the test; nothing leaves the machine."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    def __init__(self):
        self.posts: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _bodies(self, path: str) -> list[bytes]:
        with self.lock:
            return [body for posted, body in self.posts if posted == path]

    def paths(self) -> set[str]:
        with self.lock:
            return {path for path, _ in self.posts}

    def spans(self) -> list:
        """Every span received, as the protobuf message."""
        return [span for body in self._bodies("/v1/traces")
                for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                for ss in rs.scope_spans for span in ss.spans]

    def metrics(self) -> dict[str, list]:
        """The data points received, by metric name."""
        found: dict[str, list] = {}
        for body in self._bodies("/v1/metrics"):
            for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        found.setdefault(metric.name, []).extend(metric.histogram.data_points)
        return found


def attributes(span) -> dict:
    """A protobuf span's attributes as a dict of plain values."""
    values = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        values[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.values] if kind == "array_value" else value
    return values
