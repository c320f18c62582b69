"""Prometheus metrics for celery-fence (extra ``prometheus``): counters and histograms fed by its signals.

``FenceMetrics(registry)`` creates the metrics in ``registry`` (default: a new ``CollectorRegistry``; pass
``prometheus_client.REGISTRY`` to serve them with your own exporter) and ``connect(app)`` counts the runs of
that app only: the receivers compare each signal's sender with the connected apps, so two apps in one process
never mix. Labels stay low-cardinality: the task name (and a fixed ``reason`` word); never a key or token.

Prefork: the runs happen in the pool's child processes, so their counts must reach the worker's main
process, which alone serves HTTP. We use prometheus_client's multiprocess mode: ``celery worker
--fence-metrics-port N`` (or ``fence_metrics_port``) sets ``PROMETHEUS_MULTIPROC_DIR`` (to a fresh temporary
folder, unless you set it yourself) and connects the metrics in the main process *before* the pool forks;
every child inherits them and writes its values to its own memory-mapped file there; the main process serves
``/metrics`` summed over every file, children that have since exited included, so counters never go back.
The same works on the solo and threads pools (one process, one file). If you set the folder yourself, empty
it before the worker starts (prometheus_client's rule: old files would be summed in).

The takeover latency is how long, by the store's clock, the lease taken over had been expired when the new
run took it: the time the key waited for its next run. It is reported by the acquire itself (no extra round
trip) on the stores that can tell (memory, Redis); every store reports the takeover itself, so on etcd and
the SQL stores a takeover is counted without a latency.
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

from . import signals
from .errors import ConfigurationError

__all__ = ["HOLD_BUCKETS", "TAKEOVER_BUCKETS", "FenceMetrics", "prepare_multiprocess", "serve_metrics"]

log = logging.getLogger(__name__)

INF = float("inf")
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, INF)
TAKEOVER_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, INF)
INSTALL = "pip install 'celery-fence[prometheus]'"


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(f"celery-fence metrics need prometheus_client: {INSTALL}") from exc
    return prometheus_client


class FenceMetrics:
    """The celery-fence metrics in one registry; see the module docstring (and docs/metrics.md)."""

    def __init__(self, registry: Any = None) -> None:
        prom = _prometheus()
        if registry is not None and not callable(getattr(registry, "register", None)):
            raise ConfigurationError(
                f"registry must be a prometheus_client CollectorRegistry (e.g. prometheus_client.REGISTRY) "
                f"or None for a new one, got {registry!r}"
            )
        self.registry = prom.CollectorRegistry() if registry is None else registry
        self._apps: list[Any] = []

        def counter(name: str, doc: str, *extra: str) -> Any:
            return prom.Counter(f"celery_fence_{name}", doc, ("task", *extra), registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return prom.Histogram(
                f"celery_fence_{name}", doc, ("task",), registry=self.registry, buckets=buckets
            )

        self.acquired = counter("acquired", "Leases acquired by fenced runs, takeovers included")
        self.renewed = counter("renewed", "Successful renewals of a lease (one per lease per renew)")
        self.lost = counter("lost", "Leases lost while their run went on (renew refused or local deadline)")
        self.refused = counter("refused", "Fenced runs whose write or completion was refused")
        self.duplicate = counter(
            "duplicate", "Deliveries absorbed unrun: the key was done, or held by a live lease", "reason"
        )
        self.takeover = counter("takeover", "Acquires that took over an expired, unreleased lease")
        self.recovered = counter("recovered", "Abandoned runs sent again by recovery")
        self.store_wait_exhausted = counter(
            "store_wait_exhausted", "Runs that gave up waiting out an unavailable store before their body"
        )
        self.hold = histogram(
            "lease_hold_seconds", "Seconds from a run's acquire to the end of its run", HOLD_BUCKETS
        )
        self.takeover_latency = histogram(
            "takeover_latency_seconds",
            "Seconds the lease taken over had been expired (store clock) when a run took it over",
            TAKEOVER_BUCKETS,
        )

    def connect(self, app: Any) -> FenceMetrics:
        """Count ``app``'s fenced runs (call once per app; idempotent)."""
        if not hasattr(app, "conf") or not hasattr(app, "tasks"):
            raise ConfigurationError(f"connect() takes the Celery app whose runs to count, got {app!r}")
        if not any(known is app for known in self._apps):
            self._apps.append(app)
        for signal, receiver in self._receivers():
            signal.connect(receiver, weak=False, dispatch_uid=self._uid(signal))
        return self

    def disconnect(self) -> None:
        for signal, _ in self._receivers():
            signal.disconnect(dispatch_uid=self._uid(signal))
        self._apps.clear()

    def _uid(self, signal: Any) -> str:
        return f"celery_fence.metrics.{id(self)}.{signal.name}"

    def _receivers(self) -> list[tuple[Any, Callable[..., None]]]:
        return [
            (signals.lease_acquired, self._counting(self.acquired)),
            (signals.lease_renewed, self._counting(self.renewed)),
            (signals.lease_lost, self._counting(self.lost)),
            (signals.write_refused, self._counting(self.refused)),
            (signals.lease_duplicate, self._counting(self.duplicate, "reason")),
            (signals.lease_takeover, self._on_takeover),
            (signals.lease_released, self._on_released),
            (signals.run_recovered, self._on_recovered),
            (signals.store_wait_exhausted, self._counting(self.store_wait_exhausted)),
        ]

    def _task(self, sender: Any) -> str | None:
        """The task's name if ``sender`` belongs to a connected app, else ``None`` (not ours to count)."""
        app = getattr(sender, "app", None)
        return sender.name if any(known is app for known in self._apps) else None

    def _counting(self, counter: Any, *labels: str) -> Callable[..., None]:
        """A receiver that counts one for the sender's task (and the signal's ``labels`` arguments)."""

        def receive(sender: Any = None, **kwargs: Any) -> None:
            if (task := self._task(sender)) is not None:
                counter.labels(task, *(kwargs.get(name, "") for name in labels)).inc()

        return receive

    def _on_takeover(self, sender: Any = None, expired_for: float | None = None, **_: Any) -> None:
        if (task := self._task(sender)) is not None:
            self.takeover.labels(task).inc()
            if expired_for is not None:
                self.takeover_latency.labels(task).observe(max(0.0, expired_for))

    def _on_released(self, sender: Any = None, held: float = 0.0, **_: Any) -> None:
        if (task := self._task(sender)) is not None:
            self.hold.labels(task).observe(held)

    def _on_recovered(self, sender: Any = None, task: str = "", **_: Any) -> None:
        if any(known is sender for known in self._apps):  # sent with the app itself as sender
            self.recovered.labels(task).inc()


def prepare_multiprocess() -> str | None:
    """Make every process forked from here write its metrics where this one can sum them.

    Call before the pool forks. Returns the folder if it was created here (the caller removes it).
    """
    created = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        created = tempfile.mkdtemp(prefix="celery-fence-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
    _prometheus()
    values: Any = importlib.import_module("prometheus_client.values")
    # prometheus_client picks its value class when first imported; if it was imported before the folder
    # was set, pick again so the metrics created from now on are multiprocess ones. It usually was: the
    # ``celery`` program loads every ``celery.commands`` plugin at start, and Flower's imports it.
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()
    return created


def serve_metrics(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` summed over every process's file in ``PROMETHEUS_MULTIPROC_DIR``.

    Returns the HTTP server (``shutdown()`` and ``server_close()`` stop it).
    """
    prom = _prometheus()
    multiprocess = importlib.import_module("prometheus_client.multiprocess")
    registry = prom.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    server, _thread = prom.start_http_server(port, addr, registry=registry)
    log.info("celery-fence: serving Prometheus metrics on %s:%d/metrics", addr, port)
    return server
