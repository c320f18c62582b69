"""Another process holding a SQLite database's write lock: an open ``BEGIN IMMEDIATE`` transaction that
commits when told (a slow worker), or is SIGSTOPped inside it (a stopped one). Stopped by its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("committed", flush=True)
"""


class WriteLockHolder:
    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "holding\n"

    def stop(self) -> None:
        """SIGSTOP: the lock stays held until the process is resumed or killed."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def commit(self) -> None:
        """End the transaction (it holds nothing afterwards) and wait until it says so."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "committed\n"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.wait(30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@contextmanager
def holding_write_lock(path: str, stopped: bool = False) -> Iterator[WriteLockHolder]:
    """A process that holds ``path``'s write lock (SIGSTOPped inside it if ``stopped``), killed after."""
    holder = WriteLockHolder(path)
    try:
        if stopped:
            holder.stop()
        yield holder
    finally:
        holder.kill()
