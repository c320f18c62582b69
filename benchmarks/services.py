"""The services the benchmarks use, and the cleanup of everything they create.

- PostgreSQL (``FENCE_BENCH_PG``, default the ``celery_fence_test`` database on 127.0.0.1:5432): every run
  works in a schema of its own, ``fence_bench_<hex>``, dropped afterwards.
- Redis (``FENCE_BENCH_REDIS``, default 127.0.0.1:6379 db 11): broker, Redis lease store and the peers' locks,
  all under ``fence_bench`` names, deleted afterwards (never FLUSHALL/FLUSHDB).
- etcd, and a private redis-server where a count must see only the store: started here on free ports in a
  temp dir, stopped by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from celery_fence.testing import free_port

PG_URL = os.environ.get("FENCE_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/celery_fence_test")
REDIS_URL = os.environ.get("FENCE_BENCH_REDIS", "redis://127.0.0.1:6379/11")
ETCD_BIN = os.environ.get("ETCD_BIN") or shutil.which("etcd") or "/usr/bin/etcd"
PREFIX = "fence_bench"


@dataclass(frozen=True)
class PgSchema:
    name: str
    url: str  # SQLAlchemy URL whose connections use the schema (other processes can open it too)
    dsn: str  # the same for psycopg.connect


def libpq_dsn(schema: str | None = None) -> str:
    url = make_url(PG_URL)
    parts = [f"host={url.host or '127.0.0.1'}", f"port={url.port or 5432}", f"dbname={url.database}"]
    parts += [f"user={url.username}"] if url.username else []
    parts += [f"password={url.password}"] if url.password else []
    parts += [f"options='-csearch_path={schema}'"] if schema else []
    return " ".join(parts)


def _ensure_database() -> None:
    """Create ``PG_URL``'s database when the server has none of that name (a fresh machine)."""
    url = make_url(PG_URL)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            query = text("SELECT 1 FROM pg_database WHERE datname = :name")
            if conn.execute(query, {"name": url.database}).first() is None:
                with contextlib.suppress(ProgrammingError):  # another process created it meanwhile
                    conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    finally:
        admin.dispose()


@contextlib.contextmanager
def pg_schema(tag: str) -> Iterator[PgSchema]:
    """A fresh ``fence_bench_<tag>_<hex>`` schema, dropped (CASCADE) on the way out."""
    name = f"{PREFIX}_{tag}_{uuid.uuid4().hex[:8]}"
    _ensure_database()
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        sep = "&" if "?" in PG_URL else "?"
        yield PgSchema(name, f"{PG_URL}{sep}options=-csearch_path%3D{name}", libpq_dsn(name))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()


def redis_client(url: str = REDIS_URL) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)


def drop_redis_keys(*patterns: str, url: str = REDIS_URL) -> int:
    """Delete the keys matching ``patterns`` (SCAN + DEL): only the benchmarks' own names."""
    dropped = 0
    with redis_client(url) as client:
        for pattern in patterns:
            batch = list(client.scan_iter(match=pattern, count=5000))
            for start in range(0, len(batch), 5000):
                dropped += int(client.delete(*batch[start : start + 5000]))
    return dropped


class _Server:
    """A private server process in a temp dir, started and stopped by pid."""

    name = "server"

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"fence-bench-{self.name}-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def __enter__(self) -> _Server:
        with open(self.directory / "server.log", "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"{self.name} did not start; see {self.directory}/server.log")
            time.sleep(0.05)
        return self

    def __exit__(self, *_: object) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


class EtcdServer(_Server):
    name = "etcd"

    def __init__(self) -> None:
        super().__init__()
        self.peer_port = free_port()

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix: str = "fence/") -> str:
        return f"etcd://127.0.0.1:{self.port}/{prefix}"

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [ETCD_BIN, "--name", "bench", "--data-dir", str(self.directory / "data")]
        args += ["--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url]
        args += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        return [*args, "--initial-cluster", f"bench={peer}", "--log-level", "warn"]

    def healthy(self) -> bool:
        health = f"{self.client_url}/health"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(health, timeout=1) as answer:
            return bool(json.load(answer).get("health") == "true")
        return False


class RedisServer(_Server):
    """A private redis-server without persistence: INFO commandstats then counts only the store."""

    name = "redis"

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        return [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def healthy(self) -> bool:
        with contextlib.suppress(redis.RedisError), redis_client(self.url()) as client:
            return bool(client.ping())
        return False


# What a client sends on its own; INFO commandstats also counts each redis.call() inside a script.
TOP_LEVEL = (
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "script",
    "ping",
    "hello",
    "client",
    "select",
)


def redis_requests(url: str) -> int:
    """Top-level requests a Redis server has executed (INFO commandstats: scripts and connection set-up)."""
    with redis_client(url) as client:
        stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k.split("_", 1)[1].split("|")[0] in TOP_LEVEL)


def etcd_metric(store_url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus counter on the /metrics of the etcd behind ``etcd://host:port/...``."""
    netloc = store_url.split("://", 1)[1].split("/", 1)[0]
    total = 0.0
    with urllib.request.urlopen(f"http://{netloc}/metrics", timeout=5) as answer:
        metrics = answer.read().decode()
    for line in metrics.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
