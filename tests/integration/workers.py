"""Real ``celery worker`` processes for the integration and chaos tests: the fault kit's
:class:`celery_fence.testing.Worker` (what users get), on this suite's app, with task events on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from celery_fence.testing import Worker, wait_for

__all__ = ["CELERY", "ROOT", "Worker", "marks", "start_worker", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))


def start_worker(
    name: str, env: dict[str, str], workdir: Path, queues: str = "celery", pool: str = "prefork",
    concurrency: int = 1, extra: tuple[str, ...] = (), prefix: tuple[str, ...] = (),
    app_path: str = "tests.integration.fenced_app",
) -> Worker:  # fmt: skip
    """Start the worker named ``name`` of ``app_path`` (``tests.integration.fenced_app``'s app by default;
    ``prefix``: e.g. faketime) and wait until it is ready."""
    worker = Worker(
        app_path, name, workdir, queues=queues, pool=pool, concurrency=concurrency,
        env=env, args=("-E", *extra), cwd=ROOT, wrapper=prefix,
    )  # fmt: skip
    return worker.start()


def marks(workdir: Path, task_id: str, what: str) -> list[Any]:
    """(pid, wall time) of each run of ``task_id`` that reached ``what``."""
    found = []
    for path in workdir.glob(f"{task_id}.*.{what}"):
        found.append((int(path.name.split(".")[1]), float(path.read_text() or 0)))
    return sorted(found, key=lambda m: m[1])
