"""The machine the figures come from: CPU, cores, memory, load, and the versions of everything measured."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psycopg

from .services import ETCD_BIN, REDIS_URL, libpq_dsn, redis_client

PACKAGES = ("celery", "kombu", "SQLAlchemy", "psycopg", "redis", "celery-once", "fencekit")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _services() -> dict[str, Any]:
    found: dict[str, Any] = {}
    with contextlib.suppress(Exception), psycopg.connect(libpq_dsn(), connect_timeout=3) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        found["postgresql"] = row[0] if row else None
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        found["postgresql_synchronous_commit"] = sync[0] if sync else None
    with contextlib.suppress(Exception), redis_client() as client:
        found["redis"] = client.info("server")["redis_version"]
    with contextlib.suppress(Exception):
        cmd = [ETCD_BIN, "--version"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout
        found["etcd"] = out.splitlines()[0].split(":", 1)[1].strip()
    return found


def describe() -> dict[str, Any]:
    """CPU model, cores, memory, load average, Python and the versions of every package and service."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in PACKAGES},
        "services": _services(),
        "broker": REDIS_URL.rsplit("@", 1)[-1],
    }


def text(machine: dict[str, Any]) -> str:
    pk, sv = machine["packages"], machine["services"]
    load = ", ".join(f"{x:.2f}" for x in machine["load_average_at_start"])
    return "\n".join(
        [
            f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
            f"Linux {machine['kernel']}, load average at start {load}",
            f"Python {machine['python']}, Celery {pk['celery']} (kombu {pk['kombu']}), SQLAlchemy "
            f"{pk['SQLAlchemy']}, psycopg {pk['psycopg']}, redis-py {pk['redis']}",
            f"PostgreSQL {sv.get('postgresql')} "
            f"(synchronous_commit {sv.get('postgresql_synchronous_commit')}), "
            f"Redis {sv.get('redis')}, etcd {sv.get('etcd')}; peers: celery-once {pk['celery-once']}, "
            f"fencekit {pk['fencekit']}",
            "Every service runs on this machine; other processes on it (tests, other workers) add noise: "
            "compare figures within one run, and read the CPU-per-task figures beside the tasks/s.",
        ]
    )
