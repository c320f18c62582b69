"""Another process holding a SQLite database's write lock: an open ``BEGIN IMMEDIATE`` transaction that
commits when told (a slow worker), or is SIGSTOPped inside it (a stopped one). Stopped by its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .process import ServerProcess

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("committed", flush=True)
"""


class WriteLockHolder(ServerProcess):
    """Ready once it says it holds the lock; SIGKILL crashes it (SIGSTOPped or not)."""

    label = "SQLite write-lock holder"

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def start(self) -> WriteLockHolder:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stdout.readline() == "holding\n"
        return self

    def pause(self) -> None:
        """SIGSTOP: the lock stays held until the process is resumed or killed."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def commit(self) -> None:
        """End the transaction (it holds nothing afterwards) and wait until it says so."""
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == "committed\n"

    def _end(self, signum: int) -> None:
        process = self.process
        super()._end(signum)
        for stream in (process.stdin, process.stdout) if process is not None else ():
            if stream is not None:
                stream.close()


@contextmanager
def holding_write_lock(path: str, stopped: bool = False) -> Iterator[WriteLockHolder]:
    """A process that holds ``path``'s write lock (SIGSTOPped inside it if ``stopped``), killed after."""
    holder = WriteLockHolder(path).start()
    try:
        if stopped:
            holder.pause()
        yield holder
    finally:
        holder.crash()
