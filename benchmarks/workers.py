"""Real ``celery worker`` processes running :mod:`benchmarks.bench_app`: prefork, started in their own
process group, ready when the app's ``worker_ready`` hook writes its file, stopped by pid."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from celery_fence import StoreUnavailable
from celery_fence import testing as kit

DISTURBANCES = (
    "unavailable",
    "terminating connection",
    "OperationalError",
    "ConnectionError",
    "Connection to",
)
CELERY = str(Path(sys.executable).with_name("celery"))
ROOT = Path(__file__).resolve().parents[1]


def retrying(call: Any, attempts: int = 5) -> Any:
    """``call()``, tried again after a lost store connection (the machine is shared: see disturbances)."""
    for attempt in range(attempts):
        try:
            return call()
        except (StoreUnavailable, psycopg.OperationalError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def wait_for(condition: Any, timeout: float, what: str, poll: float = 0.02) -> Any:
    """The fault kit's ``wait_for``, each poll retried after a lost store connection (see ``retrying``)."""
    return kit.wait_for(lambda: retrying(condition), timeout, what, interval=poll)


class Worker(kit.Worker):
    """``celery -A benchmarks.bench_app worker -P prefork -c N -Q queue``: the fault kit's worker, logging at
    WARNING (a line per task would be measured too), so ready when the app's ``worker_ready`` hook writes its
    file rather than when its log says ``ready.``; ``env`` over os.environ."""

    def __init__(
        self, name: str, env: dict[str, str], queue: str, concurrency: int = 2, wait: bool = True
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"fence-bench-{name}-"))
        self.ready_file = self.dir / "ready"
        env = {**env, "FENCE_BENCH_READY": str(self.ready_file)}
        events = ("-E",) if os.environ.get("FENCE_BENCH_EVENTS", "1") == "1" else ()  # as Flower users run it
        super().__init__(
            "benchmarks.bench_app", name, self.dir, queues=queue, concurrency=concurrency, env=env,
            cwd=ROOT, loglevel="WARNING", args=events,
        )  # fmt: skip
        if not wait:  # waited for later with wait_ready (several workers starting at once)
            self.launch()
            return
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> Worker:
        try:
            kit.wait_for(self._ready, 60, f"worker {self.name} ready")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited: {self.errors()}")
        return self.ready_file.exists()

    def errors(self) -> str:
        """The worker's log lines at ERROR or worse, and its stderr (empty when all went well)."""
        text = ""
        for path in (self.log_path, self.err_path):
            if path.exists():
                text += path.read_text(errors="replace")
        keep = ("ERROR", "CRITICAL", "Traceback", "Error:")
        return "\n".join(line for line in text.splitlines() if any(k in line for k in keep))[-4000:]

    def disturbances(self) -> int:
        """Log lines about a store or broker connection lost: the machine is shared, and another process may
        kill connections (a chaos test terminating every 'celery-fence' backend, say). A batch during which
        this count grows measured the disturbance, not the variant, and is run again."""
        if not self.log_path.exists():
            return 0
        text = self.log_path.read_text(errors="replace")
        return sum(text.count(marker) for marker in DISTURBANCES)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the worker (TERM, then KILL) and remove its logs (kept with FENCE_BENCH_KEEP_LOGS=1)."""
        super().stop(timeout)
        if os.environ.get("FENCE_BENCH_KEEP_LOGS") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
