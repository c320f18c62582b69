"""A private PostgreSQL cluster for tests that must crash and restart the store itself.

``initdb`` in a temp dir, ``postgres`` on a free port, run as the ``postgres`` user (PostgreSQL refuses to
run as root), stopped by pid. The shared server on 5432 is never restarted: other suites use it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

from celery_fence.testing import free_port

from ..support.required import require_server
from .process import ServerProcess


def postgres_binaries() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


class PostgresServer(ServerProcess):
    """One private postmaster, started and stopped by pid: a fast shutdown (SIGINT) stops it, an immediate
    one (SIGQUIT: no checkpoint, crash recovery on the next start) crashes it."""

    label = "private PostgreSQL"
    stop_signal = signal.SIGINT
    crash_signal = signal.SIGQUIT

    def __init__(self, binaries: Path, directory: Path, port: int | None = None) -> None:
        super().__init__(directory / "postgres.log")
        self.binaries, self.directory, self.port = binaries, directory, port or free_port()
        self.data = directory / "data"
        self.settings: list[str] = []  # more ``-c name=value`` for ``postgres`` (replication: pg_pair)
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run_as(self) -> dict[str, int]:
        return {"user": self._user.pw_uid, "group": self._user.pw_gid} if self._user else {}

    def init(self) -> PostgresServer:
        if self._user:
            os.chown(self.directory, self._user.pw_uid, self._user.pw_gid)
        initdb = [str(self.binaries / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
        subprocess.run([*initdb, "-E", "UTF8"], check=True, capture_output=True, **self._run_as())  # type: ignore[call-overload]
        return self

    def start(self) -> PostgresServer:
        args = [str(self.binaries / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        args += ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.directory}"]
        args += ["-c", "fsync=on", "-c", "max_connections=500"]  # the soak's 100 pool processes
        args += [arg for setting in self.settings for arg in ("-c", setting)]
        with open(self.log, "ab") as log:  # a session of its own: kill() ends it all
            self._log_from = log.tell()
            self.process = subprocess.Popen(  # type: ignore[call-overload]
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self._run_as()
            )
        self.wait_until(self._answers, 30, self.port)
        return self

    def _answers(self) -> bool:
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, connect_timeout=1):
            return True
        return False

    def kill(self) -> None:
        """SIGKILL of the postmaster and every backend at once (its process group): a machine crash, no
        goodbye on any connection."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


@contextlib.contextmanager
def private_postgres() -> Iterator[PostgresServer]:
    binaries = postgres_binaries()
    require_server("initdb", binaries is not None, "install postgresql (apt install postgresql)")
    assert binaries is not None
    directory = Path(tempfile.mkdtemp(prefix="fence-pg-"))
    server = PostgresServer(binaries, directory).init().start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
