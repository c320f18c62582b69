"""Worker bootsteps (main process): recovery re-sends abandoned runs periodically (on by default, one
worker at a time cluster-wide: :mod:`celery_fence.worker.election`; ``--no-fence-recover`` turns it off);
``--fence-metrics-port`` serves Prometheus metrics summed over the pool's processes
(:mod:`celery_fence.metrics`); OpenTelemetry spans get the fence's attributes (:mod:`celery_fence.telemetry`)
when its Celery instrumentation is installed."""

from __future__ import annotations

import atexit
import logging
import shutil
from collections.abc import Callable
from typing import Any, ClassVar

import click
from celery import bootsteps, current_app

from .. import telemetry
from .._process import forget_in_child
from .._runtime import runtime_for, settle_at_exit
from ..config import metrics_addr, metrics_port
from ..errors import ConfigurationError, StoreUnavailable
from ..metrics import FenceMetrics, prepare_multiprocess, serve_metrics
from ..recovery import load_tasks, recover_abandoned
from ..stores import Store, open_store, store_class
from ..stores.base import RecoveryStore, lacking
from ..stores.waits import ADMIN_LOCK_WAIT, lock_wait
from .election import Election
from .startup import stop_worker

__all__ = [
    "METRICS_OPTIONS",
    "RECOVER_OPTIONS",
    "WORKER_OPTIONS",
    "FenceMetricsServer",
    "FenceRecovery",
    "add_worker_steps",
    "settle_owed_records",
]

log = logging.getLogger(__name__)

RECOVER_OPTIONS = [
    click.Option(
        ["--fence-recover/--no-fence-recover"],
        default=None,
        help="Take part in recovery: re-send fenced runs whose lease expired without completion "
        "(celery-fence; on by default, one worker at a time runs it).",
    ),
    click.Option(
        ["--fence-recover-interval"],
        type=float,
        default=None,
        help="Seconds between recovery passes (default: the lease ttl).",
    ),
]
METRICS_OPTIONS = [
    click.Option(
        ["--fence-metrics-port"],
        type=int,
        default=None,
        help="Serve celery-fence's Prometheus metrics on this port (needs celery-fence[prometheus]).",
    ),
    click.Option(
        ["--fence-metrics-addr"],
        default=None,
        help="Address the metrics server listens on (default: fence_metrics_addr, else 0.0.0.0).",
    ),
]
WORKER_OPTIONS = [*RECOVER_OPTIONS, *METRICS_OPTIONS]


class FenceRecovery(bootsteps.StartStopStep):  # type: ignore[misc]  # celery ships no type information
    requires: ClassVar[set[str]] = {"celery.worker.components:Timer"}

    def __init__(
        self,
        worker: Any,
        fence_recover: bool | None = None,
        fence_recover_interval: float | None = None,
        **kwargs: Any,
    ) -> None:
        configured = worker.app.conf.get("fence_recover", True)
        self.enabled = bool(configured if fence_recover is None else fence_recover)
        self.interval = fence_recover_interval
        self.tref: Any = None
        self.election: Election | None = None

    def start(self, worker: Any) -> None:
        config = runtime_for(worker.app).config
        missing = lacking(store_class(config.store_url), RecoveryStore)
        if missing:  # a third party's store may keep only what a run needs
            lacks = ", ".join(missing)
            log.warning("celery-fence: no recovery: the store has no recovery role (it lacks %s)", lacks)
            return
        load_tasks(worker.app)  # done by the worker already; cheap, and the same rule as the CLI's
        interval = self.interval or config.policy.ttl
        self.election = Election(ttl=3 * interval)  # outlives two missed passes
        self.tref = worker.timer.call_repeatedly(interval, self.run, (worker,), priority=10)
        log.info("celery-fence: recovery every %.1fs, when this worker is the elected recoverer", interval)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
        if self.election is not None and self.election.lease is not None:
            self._with_store(runtime_for(worker.app).config.store_url, self.election.step_down)

    def run(self, worker: Any) -> None:
        config = runtime_for(worker.app).config
        election = self.election
        assert election is not None  # started

        def one_pass(store: Store) -> None:
            if election.hold(store):
                recover_abandoned(worker.app, store, config.policy.ttl, config.max_recoveries)

        self._with_store(config.store_url, one_pass)

    @staticmethod
    def _with_store(store_url: str, action: Callable[[Store], None]) -> None:
        store = open_store(store_url)  # short-lived: none held at fork
        try:
            with lock_wait(ADMIN_LOCK_WAIT):  # the worker's timer thread: never held by a stopped process
                action(store)
        except StoreUnavailable as exc:  # transient (a locked or unreachable store): no traceback to read
            log.warning("celery-fence: recovery pass skipped, retried at the next interval: %s", exc)
        except Exception:  # a failed pass is retried at the next interval
            log.exception("celery-fence: recovery pass failed")
        finally:
            store.close()


class FenceMetricsServer(bootsteps.StartStopStep):  # type: ignore[misc]
    """Connects the metrics before the pool forks (``__init__``), serves them once the pool runs."""

    requires: ClassVar[set[str]] = {"celery.worker.components:Pool"}

    def __init__(
        self,
        worker: Any,
        fence_metrics_port: int | None = None,
        fence_metrics_addr: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.server: Any = None
        self.folder: _FolderOfThisProcess | None = None
        try:  # a bad port, or no prometheus_client: one line, before the pool forks
            self.port, self.addr = _endpoint(worker.app.conf, fence_metrics_port, fence_metrics_addr)
            self.enabled = self.port is not None
            if self.enabled:
                created = prepare_multiprocess()
                if created is not None:
                    self.folder = _FolderOfThisProcess(created)
                self.metrics = FenceMetrics().connect(worker.app)  # children inherit the receivers
        except ConfigurationError as exc:
            stop_worker(exc)

    def start(self, worker: Any) -> None:
        assert self.port is not None  # only enabled steps start
        try:
            self.server = serve_metrics(self.port, self.addr)
        except OSError as exc:  # the port is taken, or the address is not this host's
            reason = exc.strerror or str(exc)
            stop_worker(
                ConfigurationError(
                    f"fence_metrics_port (--fence-metrics-port) {self.port}: cannot serve metrics on "
                    f"{self.addr}:{self.port}: {reason}; choose a free port"
                )
            )

    def stop(self, worker: Any) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    terminate = stop  # a cold shutdown: Celery calls terminate, which StartStopStep sends only to an ``obj``


class _FolderOfThisProcess:
    """The metrics folder ``prepare_multiprocess`` made for this worker, removed when its main process exits:
    after the pool stopped writing there, whether the worker stopped or never fully started. Celery never
    calls a worker step's ``shutdown``, so a removal there left one folder in the temp dir per worker. A
    forked pool process inherits the exit hook; the folder is not its to remove."""

    def __init__(self, path: str) -> None:
        self.path: str | None = path
        forget_in_child(self)
        atexit.register(self.remove)

    def forget_after_fork(self) -> None:
        self.path = None

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _endpoint(conf: Any, port: int | None, addr: str | None) -> tuple[int | None, str]:
    """The metrics server's port and address: the worker options over the app's settings."""
    if port is None:
        checked = metrics_port(conf.get("fence_metrics_port"))
    else:
        checked = metrics_port(port, "--fence-metrics-port")
    host = metrics_addr(addr, "--fence-metrics-addr") or metrics_addr(conf.get("fence_metrics_addr"))
    return checked, host or "0.0.0.0"


def add_worker_steps(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celeryd_init`` receiver: the worker's blueprint is built after this, so the steps join it. The
    fence's span attributes are connected here too, before the pool forks, when OpenTelemetry's Celery
    instrumentation is installed (:mod:`celery_fence.telemetry`; nothing otherwise)."""
    app = getattr(instance, "app", None)
    if app is not None:
        app.steps["worker"].update((FenceRecovery, FenceMetricsServer))
        telemetry.connect(app)


def settle_owed_records(sender: Any = None, **_: Any) -> None:
    """``worker_shutdown`` (the worker's own process: solo and threads pools run tasks there) and
    ``worker_process_shutdown`` (a prefork pool process, whose app is the current one) receiver: write the
    records the process owes its store, or log them (:class:`celery_fence._runtime.OwedRecords`)."""
    settle_at_exit(getattr(sender, "app", None) or current_app)
