"""The world of the real-worker tests (tests/integration and tests/chaos): a Redis broker (or RabbitMQ,
asked for by ``broker="rabbitmq"``) and a Redis result backend, a lease store (PostgreSQL by default; Redis
and etcd through their contract harnesses), a PostgreSQL schema for the tasks' own tables, a queue of its
own per test, and workers that are always stopped by pid."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kombu import pools
from kombu.utils.collections import eqhash
from sqlalchemy import Engine, text

from tests.servers.restartable import restartable_store
from tests.support.harnesses import HARNESSES
from tests.support.harnesses.sql import pg_schema_store

from .fenced_app import accounts, ledger
from .rabbitmq import own_vhost, private_node
from .workers import Worker, start_worker

STORES = ("postgresql", "redis", "etcd")
# Redis databases of the broker and the result backend. The soak moves them (kombu's visibility-timeout
# restore scans one unacked index per database, so a soak case would re-deliver other suites' messages).
BROKER_DB = os.environ.get("FENCE_TEST_BROKER_DB", "14")
BACKEND_DB = os.environ.get("FENCE_TEST_BACKEND_DB", "13")
ALL_STORES = ("postgresql", "sqlite", "redis", "etcd")
RABBITMQ = {
    "broker": "rabbitmq"
}  # in a cluster's parameters: a RabbitMQ broker, on a vhost of the test's own


def on_every_store(**options: str) -> list[Any]:
    """``@pytest.mark.parametrize("cluster", on_every_store(ttl="2"), indirect=True)``."""
    return [pytest.param({"store": name, **options}, id=name) for name in STORES]


def on_rabbitmq(store: str = "postgresql", **options: str) -> Any:
    """The same test on a RabbitMQ broker (a vhost of its own), with one lease store: add it to a
    parametrization of ``cluster``. ``consumer_timeout`` (ms) runs it on a private node instead."""
    return pytest.param({"store": store, **RABBITMQ, **options}, id=f"{store}-rabbitmq")


@dataclass
class Cluster:
    """One test's world: its lease store, its app (client side), its queue, its workers."""

    store: Any
    user_db: Engine
    app: Any
    env: dict[str, str]
    workdir: Path
    queue: str
    workers: list[Worker] = field(default_factory=list)
    server: Any = None  # the store's private server, when the test asked for a restartable one

    def worker(
        self, name: str, queues: str | None = None, env: dict[str, str] | None = None, **options: Any
    ) -> Worker:
        worker = start_worker(
            name, {**self.env, **(env or {})}, self.workdir, queues=queues or self.queue, **options
        )
        self.workers.append(worker)
        return worker

    def effects(self, key: str) -> list[tuple[Any, ...]]:
        """Every accepted effect of ``key`` as ``(key, token, task_id, pid)``, however it was written."""
        logged = text("SELECT key, token, task_id, pid FROM fence_it_effects WHERE key = :k")
        guarded = text("SELECT key, token, task_id, pid, writes FROM fence_it_accounts WHERE key = :k")
        with effects_engine(self.store, self.user_db).connect() as conn:
            rows = [tuple(r) for r in conn.execute(logged, {"k": key})]
        with self.user_db.connect() as conn:
            counted = conn.execute(guarded, {"k": key}).all()
        return rows + [tuple(r[:4]) for r in counted for _ in range(r.writes)]

    def events(self, key: str) -> list[tuple[str, int]]:
        return [(e.event, e.token) for e in self.store.history(key)]

    @property
    def on_rabbitmq(self) -> bool:
        return self.env["FENCE_IT_BROKER"].startswith("amqp://")


def effects_engine(store: Any, user_db: Engine) -> Engine:
    """Fenced transactions write where the lease rows are: the store's own database when it is SQL."""
    engine: Engine = getattr(store, "engine", user_db)
    return engine


@contextlib.contextmanager
def _lease_store(
    name: str, user_db: Any, request: pytest.FixtureRequest, restartable: bool
) -> Iterator[tuple[Any, Any]]:
    """``(store, server)``; ``server`` is None unless the test asked for a server it may restart."""
    if restartable:
        with restartable_store(name, request) as pair:
            yield pair
        return
    if name == "postgresql":  # the lease rows share the schema of the tasks' tables
        yield user_db, None
        return
    opened = HARNESSES[name].open(request)
    try:
        yield next(opened), None
    finally:
        opened.close()


@contextlib.contextmanager
def _broker_url(params: dict[str, str], redis_base: str) -> Iterator[str]:
    if params.get("broker", "redis") == "redis":
        yield f"{redis_base}/{BROKER_DB}"
    elif "consumer_timeout" in params:
        with private_node(int(params["consumer_timeout"])) as url:
            yield url
    else:
        with own_vhost() as url:
            yield url


def _use_broker(app: Any, url: str) -> None:
    """Point this process's app at ``url``. Celery takes its connection and producer pools from kombu's
    registry (keyed by the broker's URL) and keeps them for the app's life: drop the app's references, so the
    next send takes the pools of ``url``. A RabbitMQ vhost or node goes at the end of its test: its pools are
    closed and taken out of the registry (the Redis broker's stay, for the next test on it)."""
    if app.conf.broker_url == url:
        return
    if str(app.conf.broker_url).startswith("amqp://"):
        key = eqhash(app.connection_for_write())
        for group in (pools.producers, pools.connections):
            pool = dict.pop(group, key, None)
            if pool is not None:
                pool.force_close_all()
    app._pool = None
    app.amqp._producer_pool = None
    app.conf.broker_url = url


@contextlib.contextmanager
def running_cluster(
    postgres_url: str, redis_server_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """The world of one test (the ``cluster`` fixture of tests/integration and tests/chaos): its parameters
    (``request.param``) choose the store, the broker and the ttl; every worker is stopped by pid after."""
    from . import fenced_app

    params = getattr(request, "param", {})
    ttl, visibility = params.get("ttl", "2"), params.get("visibility", "3600")
    redis_base = redis_server_url.rsplit("/", 1)[0]
    with (
        pg_schema_store(postgres_url) as user_db,
        _lease_store(
            params.get("store", "postgresql"), user_db, request, bool(params.get("restartable"))
        ) as (store, server),
        _broker_url(params, redis_base) as broker_url,
    ):
        store.migrate()
        with effects_engine(store, user_db.engine).begin() as conn:
            conn.execute(
                text("CREATE TABLE fence_it_effects (key TEXT, token BIGINT, task_id TEXT, pid INT)")
            )
        accounts.create(user_db.engine)
        ledger.create(effects_engine(store, user_db.engine), checkfirst=True)
        ledger.create(user_db.engine, checkfirst=True)
        queue = f"fence-it-{uuid.uuid4().hex[:8]}"
        env = {
            "FENCE_IT_BROKER": broker_url,
            "FENCE_IT_BACKEND": f"{redis_base}/{BACKEND_DB}",
            "FENCE_IT_STORE": store.url,
            "FENCE_IT_USER_DB": user_db.url,
            "FENCE_IT_TTL": str(ttl),
            "FENCE_IT_DIR": str(tmp_path),
            "FENCE_IT_VISIBILITY": str(visibility),
        }
        app = fenced_app.app
        _use_broker(app, broker_url)
        app.conf.update(
            result_backend=env["FENCE_IT_BACKEND"],
            task_default_queue=queue,
            fence_store_url=store.url,
            fence_lease_ttl=float(ttl),
        )
        world = Cluster(store, user_db.engine, app, env, tmp_path, queue, server=server)
        try:
            yield world
        finally:
            for worker in world.workers:  # all at once: each warm shutdown takes seconds
                worker.terminate()
            for worker in world.workers:  # the test is over: a task still running is not waited for
                worker.stop(timeout=5.0)
            if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
                for worker in world.workers:
                    print(f"--- {worker.name} log ---\n{worker.log_text()[-4000:]}")
            _use_broker(app, f"{redis_base}/{BROKER_DB}")  # no connection left open to a vhost that goes


@pytest.fixture
def cluster(
    postgres_url: str, redis_server_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """One test's world (:func:`running_cluster`): the fixture of tests/integration and tests/chaos, whose
    conftests name it."""
    with running_cluster(postgres_url, redis_server_url, tmp_path, request) as world:
        yield world
