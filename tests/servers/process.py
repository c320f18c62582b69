"""What every server process a test starts has in common: started, waited for until it answers, stopped
and crashed by its pid (never by name), and a readable tail of its log when it did not start."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def end_process(process: subprocess.Popen[Any] | None, signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to a server this suite started (by pid, never by name) and reap it."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signum)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerProcess:
    """One server process: ``start()`` it (a subclass launches it and waits until it answers), ``stop()``
    it cleanly, ``crash()`` it. ``label`` names it in a failure; ``log`` is the file it writes to, if any."""

    label = "server"
    stop_signal = signal.SIGTERM
    crash_signal = signal.SIGKILL

    def __init__(self, log: Path | None = None) -> None:
        self.log = log
        self.process: subprocess.Popen[Any] | None = None
        self._log_from = 0  # where this launch's lines start in the log

    def stop(self) -> None:
        self._end(self.stop_signal)

    def crash(self) -> None:
        """``crash_signal``: what survives is what the server had made durable."""
        self._end(self.crash_signal)

    def _end(self, signum: int) -> None:
        process, self.process = self.process, None
        end_process(process, signum)

    def wait_until(self, answers: Callable[[], bool], timeout: float, port: int) -> None:
        """Until ``answers()``; a process that exits or stays silent past ``timeout`` is stopped and the
        test fails with its log (:meth:`not_started`)."""
        deadline = time.monotonic() + timeout
        while not answers():
            if self.process is None or self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.not_started(port, self.log_tail())
            time.sleep(0.05)

    def not_started(self, port: int, log_tail: str) -> None:
        pytest.fail(f"{self.label} on port {port} did not start:\n{log_tail}")

    def log_tail(self) -> str:
        """The last 2,000 characters this launch wrote to its log."""
        if self.log is None:
            return ""
        with open(self.log, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")[-2000:]
