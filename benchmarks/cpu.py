"""CPU time of the processes a benchmark drives, read from /proc (this machine runs every service).

Tasks per second move with whatever else loads the machine; CPU seconds per task hardly do, so they show a
variant's own cost: the worker (main process and pool children), the PostgreSQL backends serving the
worker's connections (found by their client ports), and a private store server (redis-server, etcd).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg

from .services import libpq_dsn

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _local_ports(pids: set[int], remote_port: int) -> list[int]:
    """Local ports of the TCP connections that ``pids`` hold to ``remote_port`` on this machine."""
    out = subprocess.run(["ss", "-Htnp"], capture_output=True, text=True, check=False).stdout
    ports = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 6 or not cols[4].endswith(f":{remote_port}"):
            continue
        users = " ".join(cols[5:])  # a process title may hold spaces: "[celeryd: name:MainProcess]"
        if any(f"pid={pid}," in users for pid in pids):
            ports.append(int(cols[3].rsplit(":", 1)[1]))
    return ports


def pg_backends(client_pids: set[int], pg_port: int = 5432) -> list[int]:
    """The PostgreSQL backend processes serving the connections of ``client_pids``."""
    ports = _local_ports(client_pids, pg_port)
    if not ports:
        return []
    with psycopg.connect(libpq_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
        ).fetchall()
    return [int(r[0]) for r in rows]


class CpuMeter:
    """CPU seconds so far of a worker, the PostgreSQL backends serving it, and a private store server."""

    def __init__(self, worker: object, server_pid: int | None = None, proxy_pid: int | None = None) -> None:
        """``proxy_pid``: the workers reach PostgreSQL through this process (:mod:`benchmarks.network`)."""
        self.worker, self.server_pid, self.proxy_pid = worker, server_pid, proxy_pid

    def read(self) -> dict[str, float]:
        pids = {self.worker.proc.pid, *self.worker.children()}  # type: ignore[attr-defined]
        pg_clients = pids if self.proxy_pid is None else {self.proxy_pid}
        reading = {
            "worker": sum(proc_cpu(pid) for pid in pids),
            "postgres": sum(proc_cpu(pid) for pid in pg_backends(pg_clients)),
        }
        if self.server_pid is not None:
            reading["store_server"] = proc_cpu(self.server_pid)
        if self.proxy_pid is not None:
            reading[PROXY] = proc_cpu(self.proxy_pid)
        return reading

    @staticmethod
    def per_task(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
        """µs of CPU per task by process group, and their total (the proxy's, a stand-in for a network,
        left out of it)."""
        spent = {k: (after[k] - before[k]) / n * 1e6 for k in before}
        spent["total"] = sum(v for k, v in spent.items() if k != PROXY)
        return spent


PROXY = "network_proxy"  # a CPU group: the process standing in for a network (benchmarks.network)
