"""Real ``celery worker`` processes running :mod:`benchmarks.bench_app`: prefork, started in their own
process group, ready when the app's ``worker_ready`` hook writes its file, stopped by pid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from celery_fence import StoreUnavailable

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
    """Poll until ``condition()`` is truthy; fail after ``timeout`` (a bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while True:
        value = retrying(condition)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


class Worker:
    """``celery -A benchmarks.bench_app worker -P prefork -c N -Q queue`` with ``env`` over os.environ."""

    def __init__(
        self, name: str, env: dict[str, str], queue: str, concurrency: int = 2, wait: bool = True
    ) -> None:
        self.name, self.env = name, env
        self.dir = Path(tempfile.mkdtemp(prefix=f"fence-bench-{name}-"))
        self.log, self.ready = self.dir / "worker.log", self.dir / "ready"
        cmd = [CELERY, "-A", "benchmarks.bench_app", "worker", "-P", "prefork", "-c", str(concurrency)]
        cmd += ["-n", f"{name}@%h", "-Q", queue, "--without-gossip", "--without-mingle"]
        cmd += ["--without-heartbeat", "-l", "WARNING", "--logfile", str(self.log)]
        full_env = {**os.environ, **env, "FENCE_BENCH_READY": str(self.ready), "PYTHONPATH": str(ROOT)}
        with open(self.dir / "worker.err", "wb") as err:
            self.proc = subprocess.Popen(
                cmd, env=full_env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err
            )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> Worker:
        try:
            wait_for(self._ready, 60, f"worker {self.name} ready", poll=0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited: {self.errors()}")
        return self.ready.exists()

    def errors(self) -> str:
        """The worker's log lines at ERROR or worse, and its stderr (empty when all went well)."""
        text = ""
        for path in (self.log, self.dir / "worker.err"):
            if path.exists():
                text += path.read_text(errors="replace")
        keep = ("ERROR", "CRITICAL", "Traceback", "Error:")
        return "\n".join(line for line in text.splitlines() if any(k in line for k in keep))[-4000:]

    def disturbances(self) -> int:
        """Log lines about a store or broker connection lost: the machine is shared, and another process may
        kill connections (a chaos test terminating every 'celery-fence' backend, say). A batch during which
        this count grows measured the disturbance, not the variant, and is run again."""
        if not self.log.exists():
            return 0
        text = self.log.read_text(errors="replace")
        return sum(text.count(marker) for marker in DISTURBANCES)

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False)
        return [int(pid) for pid in out.stdout.split()]

    def stop(self) -> None:
        """Stop the worker (TERM, then KILL) and remove its logs (kept with FENCE_BENCH_KEEP_LOGS=1)."""
        if self.proc.poll() is None:
            pgid = os.getpgid(self.proc.pid)
            os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(pgid, signal.SIGKILL)
                self.proc.wait(10)
        if os.environ.get("FENCE_BENCH_KEEP_LOGS") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
