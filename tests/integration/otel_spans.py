"""Loaded into a test's worker (``celery worker -I tests.integration.otel_spans``): each pool process
instruments Celery with OpenTelemetry once it is forked, as OpenTelemetry's Celery guide does, and writes
every finished span to ``<FENCE_IT_DIR>/spans.<pid>.jsonl`` (name, end time, attributes, events), which
the test reads (tests/integration/test_worker_spans.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLines(SpanExporter):
    """Each span, as it ends, one JSON line (SimpleSpanProcessor: in the task's own process, at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                events = [[e.name, dict(e.attributes or {})] for e in span.events]
                line = {"name": span.name, "end": span.end_time, "attributes": dict(span.attributes or {})}
                line["events"] = events
                out.write(json.dumps(line, default=str) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@worker_process_init.connect(weak=False)
def trace_this_process(**_: Any) -> None:
    provider = TracerProvider()
    folder = Path(os.environ.get("FENCE_IT_DIR", "/tmp"))
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(folder / f"spans.{os.getpid()}.jsonl")))
    CeleryInstrumentor().instrument(tracer_provider=provider)
