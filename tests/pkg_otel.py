"""Run by ``tox -e pkg`` in a venv holding the wheel with its ``otel`` extra only (no SDK): the Celery
instrumentation imports, ``celery_fence.telemetry`` connects an app's receivers, and an instrumented run
(its span is not recording without an SDK) goes through them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor

import celery_fence
from celery_fence import FencedTask, signals, telemetry

here = Path(__file__).resolve().parents[1] / "celery_fence"
assert Path(celery_fence.__file__).parent.resolve() != here, "imported the source tree, not the wheel"

app = Celery("pkg-otel", broker="memory://", backend="cache+memory://", set_as_current=False)
app.conf.fence_store_url = "memory://"


@app.task(base=FencedTask, bind=True, name="pkg.otel", shared=False)
def work(self: Any) -> int:
    return int(self.fence.token)


assert telemetry.connect(app), "celery_fence.telemetry found no opentelemetry-instrumentation-celery"
uids = [str(key[0]) for key, _ in signals.run_ended.receivers]
assert any(uid.startswith("celery_fence.telemetry.") for uid in uids), uids
CeleryInstrumentor().instrument()
assert work.apply().get() == 1
CeleryInstrumentor().uninstrument()
telemetry.disconnect(app)
print(f"celery-fence[otel] alone: celery_fence.telemetry connects, from {Path(telemetry.__file__).parent}")
