"""The store across a network, for ``python -m benchmarks --only fence_cost --rtt-ms N``. Every service runs
on this machine, so a round trip costs CPU but no waiting, and a fence that saves round trips saves little.
Here the workers reach PostgreSQL through the fault kit's :class:`~celery_fence.testing.StoreProxy`, which
holds each chunk ``N / 2`` ms each way: a round trip takes ``N`` ms more, as to a server in another rack or
zone.

The proxy runs in a process of its own: its CPU (a Python process relaying every chunk: far more per round
trip than a kernel's network stack) is read apart, not counted as the fence's, and the PostgreSQL backends
are found through its connections. It shares the machine's two cores with the worker all the same, which
favours the variants that make fewer round trips: the figures say how much it spent.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy.engine import make_url

from .services import PG_URL, PgSchema
from .stores import LeaseStore

_PROXY = (
    "import sys\n"
    "from celery_fence.testing import StoreProxy\n"
    "proxy = StoreProxy.for_url(sys.argv[1])\n"
    "proxy.delay(float(sys.argv[2]))\n"
    "print(proxy.port, flush=True)\n"
    "sys.stdin.read()  # until the benchmark closes our stdin\n"
    "proxy.close()\n"
)


@dataclass(frozen=True)
class DelayedPostgres:
    """The proxy's process and port: what the workers are pointed at instead of PostgreSQL's."""

    pid: int
    port: int

    def url(self, url: str) -> str:
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def dsn(self, dsn: str) -> str:
        return re.sub(r"\bport=\d+", f"port={self.port}", re.sub(r"\bhost=\S+", "host=127.0.0.1", dsn))

    def lease(self, lease: LeaseStore) -> LeaseStore:
        return LeaseStore(self.url(lease.url), lease.server_pid, lease.redis_url)

    def schema(self, schema: PgSchema) -> PgSchema:
        return PgSchema(schema.name, self.url(schema.url), self.dsn(schema.dsn))


@contextlib.contextmanager
def delayed_postgres(rtt_ms: float) -> Iterator[DelayedPostgres]:
    """A proxy in front of ``PG_URL``'s server adding ``rtt_ms`` to every round trip, stopped on the way
    out (by its pid, if it does not stop when told)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROXY, PG_URL, str(rtt_ms / 2000.0)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        yield DelayedPostgres(proc.pid, int(proc.stdout.readline()))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
