"""Real ``celery worker`` processes for the integration tests: started in their own process group,
stopped by pid, their children found through the marks the tasks write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
CELERY = str(Path(sys.executable).with_name("celery"))
ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll until ``condition()`` is truthy; fail after ``timeout`` (a bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Worker:
    def __init__(
        self,
        name: str,
        env: dict[str, str],
        workdir: Path,
        queues: str = "celery",
        pool: str = "prefork",
        concurrency: int = 1,
        extra: tuple[str, ...] = (),
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.name, self.log = name, workdir / f"{name}.log"
        cmd = [
            *prefix,  # e.g. faketime -f +300s
            CELERY,
            "-A",
            "tests.integration.fenced_app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "-Q",
            queues,
            "-E",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
            "--logfile",
            str(self.log),
            *extra,
        ]
        full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        with open(workdir / f"{name}.err", "wb") as stderr:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                cmd, env=full_env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr
            )
        wait_for(lambda: self.log.exists() and "ready." in self.log.read_text(), 60, f"{name} ready")

    def children(self) -> list[int]:
        """The pool's processes (the worker's own children), from /proc."""
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
            except (OSError, StopIteration):
                continue
            if int(ppid.split()[1]) == self.proc.pid:
                found.append(int(status.parent.name))
        return found

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGCONT)  # a stopped child would never see the TERM
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)


def marks(workdir: Path, task_id: str, what: str) -> list[Any]:
    """(pid, wall time) of each run of ``task_id`` that reached ``what``."""
    found = []
    for path in workdir.glob(f"{task_id}.*.{what}"):
        found.append((int(path.name.split(".")[1]), float(path.read_text() or 0)))
    return sorted(found, key=lambda m: m[1])
