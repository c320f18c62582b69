"""Fixtures for real-worker tests: a Redis broker and result backend, a PostgreSQL store on its own
schema, a queue of its own per test, and workers that are always stopped by pid."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.contract.harness import pg_schema_store

from .workers import Worker


@dataclass
class Cluster:
    """One test's world: its store, its app (client side), its queue, its workers."""

    store: Any
    app: Any
    env: dict[str, str]
    workdir: Path
    queue: str
    workers: list[Worker] = field(default_factory=list)

    def worker(
        self, name: str, queues: str | None = None, env: dict[str, str] | None = None, **options: Any
    ) -> Worker:
        worker = Worker(
            name, {**self.env, **(env or {})}, self.workdir, queues=queues or self.queue, **options
        )
        self.workers.append(worker)
        return worker

    def effects(self, key: str | None = None) -> list[tuple[Any, ...]]:
        query = "SELECT key, token, task_id, pid FROM fence_it_effects"
        with self.store.engine.connect() as conn:
            rows = conn.execute(text(query + (" WHERE key = :k" if key else "")), {"k": key}).all()
        return [tuple(r) for r in rows]

    def events(self, key: str) -> list[tuple[str, int]]:
        return [(e.event, e.token) for e in self.store.history(key)]


@pytest.fixture
def cluster(
    postgres_url: str, redis_server_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    from . import fenced_app

    ttl = getattr(request, "param", {}).get("ttl", "2")
    visibility = getattr(request, "param", {}).get("visibility", "3600")
    redis_base = redis_server_url.rsplit("/", 1)[0]
    with pg_schema_store(postgres_url) as store:
        store.migrate()
        with store.engine.begin() as conn:
            conn.execute(
                text("CREATE TABLE fence_it_effects (key TEXT, token BIGINT, task_id TEXT, pid INT)")
            )
        queue = f"fence-it-{uuid.uuid4().hex[:8]}"
        env = {
            "FENCE_IT_BROKER": f"{redis_base}/14",
            "FENCE_IT_BACKEND": f"{redis_base}/13",
            "FENCE_IT_STORE": store.url,
            "FENCE_IT_TTL": str(ttl),
            "FENCE_IT_DIR": str(tmp_path),
            "FENCE_IT_VISIBILITY": str(visibility),
        }
        app = fenced_app.app
        app.conf.update(
            broker_url=env["FENCE_IT_BROKER"],
            result_backend=env["FENCE_IT_BACKEND"],
            task_default_queue=queue,
            fence_store_url=store.url,
            fence_lease_ttl=float(ttl),
        )
        world = Cluster(store, app, env, tmp_path, queue)
        try:
            yield world
        finally:
            for worker in world.workers:
                worker.stop()
            for worker in world.workers:
                if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
                    print(f"--- {worker.name} log ---\n{worker.log_text()[-4000:]}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
