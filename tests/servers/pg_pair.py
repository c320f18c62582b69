"""A private PostgreSQL primary and its streaming standby, for the failover tests.

Two clusters on two loopback ports that stay the same across failovers, so one libpq multi-host URL
(``?host=127.0.0.1:p1&host=127.0.0.1:p2&target_session_attrs=read-write``) names the pair for its whole
life: :meth:`PostgresPair.fail_over` SIGKILLs the primary's whole process group, promotes the standby
(``pg_promote()``), then makes a fresh standby of the new primary (``pg_basebackup -R``) on the dead one's
port. The standby streams through the fault kit's TCP proxy, so a test can cut replication (a lagging
asynchronous standby). Replication is asynchronous, or synchronous (``synchronous_standby_names = '*'``,
set on a primary only while its standby streams: a promoted standby alone must not wait for a standby it
does not have).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from celery_fence.testing import StoreProxy

from ..support.required import require_server
from .postgres import PostgresServer, postgres_binaries

__all__ = ["PostgresPair", "multi_host_url", "postgres_pair"]


def multi_host_url(ports: tuple[int, ...], database: str = "postgres") -> str:
    """The SQLAlchemy form of a libpq multi-host URL that only ever connects to the read-write server."""
    hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
    return f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write"


def _sql(port: int, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
        cursor = conn.execute(statement, args or None)
        return cursor.fetchall() if cursor.description else []


def _poll(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


class PostgresPair:
    """A primary and a standby; ``synchronous`` chooses how the standby acknowledges commits."""

    def __init__(self, binaries: Path, root: Path, synchronous: bool) -> None:
        self.binaries, self.root, self.synchronous = binaries, root, synchronous
        self._dirs = 0
        self.primary = PostgresServer(binaries, self._new_dir()).init().start()
        self.standby = self._standby_of(self.primary)
        self.ports = (self.primary.port, self.standby.port)
        self.failovers = 0

    def url(self, database: str = "postgres") -> str:
        return multi_host_url(self.ports, database)

    def _new_dir(self) -> Path:
        self._dirs += 1
        directory = self.root / f"node-{self._dirs}"
        directory.mkdir()
        return directory

    def _standby_of(self, primary: PostgresServer, port: int | None = None) -> PostgresServer:
        standby = PostgresServer(self.binaries, self._new_dir(), port)
        self._link = StoreProxy("127.0.0.1", primary.port)  # the standby streams through it (-R keeps it)
        if standby._user:
            os.chown(standby.directory, standby._user.pw_uid, standby._user.pw_gid)
        backup = [str(self.binaries / "pg_basebackup"), "-D", str(standby.data), "-R", "-X", "stream"]
        backup += ["-h", "127.0.0.1", "-p", str(self._link.port), "-U", "postgres", "-c", "fast"]
        subprocess.run(backup, check=True, capture_output=True, **standby._run_as())  # type: ignore[call-overload]
        standby.start()
        try:
            _poll(lambda: self._streaming(primary), "the standby to stream from the primary")
            if self.synchronous:  # only now: a primary without its standby would hold every commit
                _sql(primary.port, "ALTER SYSTEM SET synchronous_standby_names = '*'")
                _sql(primary.port, "SELECT pg_reload_conf()")
                _poll(lambda: self._streaming(primary, "sync"), "the standby to be synchronous")
        except BaseException:  # not ours to stop yet: stop it here
            standby.kill()
            raise
        return standby

    @staticmethod
    def _streaming(primary: PostgresServer, state: str | None = None) -> bool:
        rows = _sql(primary.port, "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")
        return bool(rows) and (state is None or rows[0][0] == state)

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        lsn = _sql(self.primary.port, "SELECT pg_current_wal_lsn()")[0][0]
        replayed = "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn >= %s"
        _poll(lambda: _sql(self.primary.port, replayed, lsn) == [(1,)], "the standby to replay the primary")

    def stop_replication(self) -> None:
        """From now until the failover, the standby receives nothing (the fault kit's proxy on its link
        to the primary cut): what the primary commits meanwhile is on the primary only, as on an
        asynchronous standby that lags. (On a synchronous pair every commit would wait instead.)"""
        self._link.cut()

    @contextlib.contextmanager
    def failing_over(self, gated: bool = False) -> Iterator[None]:
        """The primary SIGKILLed, then the standby promoted; with ``gated``, the new primary stays
        read-only for clients (``default_transaction_read_only``, which ``target_session_attrs=read-write``
        skips) while the block runs: the window for ``celery fence advance`` before any token is issued
        (docs/operating.md). A fresh standby of the new primary is made on the dead one's port after."""
        old, new = self.primary, self.standby
        for setting in ("synchronous_standby_names",) + (("default_transaction_read_only",) if gated else ()):
            value = "DEFAULT" if setting.startswith("sync") else "on"
            _sql(new.port, f"ALTER SYSTEM SET {setting} = {value}")
        _sql(new.port, "SELECT pg_reload_conf()")
        old.kill()
        self._link.close()
        assert _sql(new.port, "SELECT pg_promote(true, 60)") == [(True,)]
        self.primary, self.failovers = new, self.failovers + 1
        try:
            yield
        finally:
            if gated:
                _sql(new.port, "ALTER SYSTEM RESET default_transaction_read_only")
                _sql(new.port, "SELECT pg_reload_conf()")
        shutil.rmtree(old.directory, ignore_errors=True)
        self.standby = self._standby_of(new, port=old.port)

    def stop(self) -> None:
        for server in (self.primary, self.standby):
            server.kill()
        self._link.close()


@contextlib.contextmanager
def postgres_pair(synchronous: bool) -> Iterator[PostgresPair]:
    binaries = postgres_binaries()
    require_server("initdb", binaries is not None, "install postgresql (apt install postgresql)")
    assert binaries is not None
    root = Path(tempfile.mkdtemp(prefix="fence-pg-pair-"))
    root.chmod(0o755)  # the postgres user goes through it to its clusters' directories
    pair: PostgresPair | None = None
    try:
        pair = PostgresPair(binaries, root, synchronous)
        yield pair
    finally:
        if pair is not None:
            pair.stop()
        shutil.rmtree(root, ignore_errors=True)
