"""FenceMetrics on a private registry, fed by eager runs on a memory store with a fake clock. No sleeps."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_fence import ConfigurationError, FencedTask, FenceMetrics, Lease, LeasePolicy
from celery_fence._runtime import Renewer, runtime_for
from celery_fence.config import FenceConfig
from celery_fence.signals import run_recovered, store_wait_exhausted, write_refused
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock


def make_app(name: str, clock: FakeClock) -> Celery:
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    runtime_for(app)._store = MemoryStore(clock=clock)  # the test moves the store's time
    return app


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[Celery]:
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    app = make_app("unit", clock)
    yield app
    runtime_for(app).close()


@pytest.fixture
def metrics(app: Celery) -> Iterator[FenceMetrics]:
    metrics = FenceMetrics(CollectorRegistry()).connect(app)
    yield metrics
    metrics.disconnect()


def value(metrics: FenceMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"celery_fence_{name}", labels) or 0.0


def fenced(app: Celery) -> Any:
    @app.task(base=FencedTask, bind=True, name="unit.charge", fence_key="order:{order}", shared=False)
    def charge(self: Any, order: int) -> int:
        return order

    return charge


def test_a_run_counts_its_acquire_and_hold_time_and_a_second_delivery_a_duplicate(
    app: Celery, metrics: FenceMetrics
) -> None:
    charge = fenced(app)
    assert charge.apply((7,)).get() == 7
    assert charge.apply((7,)).get() == 7  # the key is done: its stored result, unrun
    assert value(metrics, "acquired_total", task="unit.charge") == 1
    assert value(metrics, "duplicate_total", task="unit.charge", reason="done") == 1
    assert value(metrics, "lease_hold_seconds_count", task="unit.charge") == 1
    assert value(metrics, "takeover_total", task="unit.charge") == 0


def test_a_takeover_is_counted_with_how_long_the_old_lease_had_expired(
    app: Celery, metrics: FenceMetrics, clock: FakeClock
) -> None:
    charge = fenced(app)
    runtime_for(app).store.acquire("order:8", "a dead worker", 5.0)
    clock.advance(7.5)
    charge.apply((8,))
    assert value(metrics, "takeover_total", task="unit.charge") == 1
    assert value(metrics, "acquired_total", task="unit.charge") == 1
    assert value(metrics, "takeover_latency_seconds_count", task="unit.charge") == 1
    assert value(metrics, "takeover_latency_seconds_sum", task="unit.charge") == pytest.approx(2.5)
    assert value(metrics, "takeover_latency_seconds_bucket", task="unit.charge", le="5.0") == 1
    assert value(metrics, "takeover_latency_seconds_bucket", task="unit.charge", le="2.0") == 0


def test_another_apps_runs_are_not_counted(app: Celery, metrics: FenceMetrics, clock: FakeClock) -> None:
    other = make_app("other", clock)
    charge = fenced(other)  # the same task name as the connected app's
    charge.apply((9,))
    write_refused.send(sender=charge, key="k", token=1, task_id="t", reason="stale")
    run_recovered.send(sender=other, key="k", task="unit.charge", task_id="t", attempt=1)
    assert metrics.registry.get_sample_value("celery_fence_acquired_total", {"task": "unit.charge"}) is None
    assert value(metrics, "refused_total", task="unit.charge") == 0
    assert value(metrics, "recovered_total", task="unit.charge") == 0
    runtime_for(other).close()


def test_refusals_and_recoveries_of_the_connected_app_are_counted(app: Celery, metrics: FenceMetrics) -> None:
    charge = fenced(app)
    write_refused.send(sender=charge, key="k", token=1, task_id="t", reason="stale")
    run_recovered.send(sender=app, key="k", task="unit.charge", task_id="t", attempt=1)
    assert value(metrics, "refused_total", task="unit.charge") == 1
    assert value(metrics, "recovered_total", task="unit.charge") == 1


def test_a_run_that_gave_up_on_the_store_is_counted(app: Celery, metrics: FenceMetrics) -> None:
    charge = fenced(app)
    store_wait_exhausted.send(sender=charge, key="k", task_id="t", waited=600.0)
    assert value(metrics, "store_wait_exhausted_total", task="unit.charge") == 1


def test_the_renewer_reports_each_successful_renew(clock: FakeClock, store: MemoryStore) -> None:
    policy, renewed = LeasePolicy(9.0), []
    renewer = Renewer(store, policy.interval, clock=clock)
    lease = store.acquire("k", "a", policy.ttl)
    renewer.track(lease, policy, clock(), lambda *_: None, renewed.append)
    clock.advance(policy.interval)
    renewer.tick()
    assert renewed == [lease]
    stale = Lease("k", lease.token + 1, "b")
    renewer.track(stale, policy, clock(), lambda *_: None, renewed.append)
    clock.advance(policy.interval)
    renewer.tick()  # the stale one is lost, not renewed
    assert renewed == [lease, lease]


def test_disconnected_metrics_count_nothing(app: Celery) -> None:
    metrics = FenceMetrics().connect(app)
    metrics.disconnect()
    fenced(app).apply((10,))
    assert value(metrics, "acquired_total", task="unit.charge") == 0


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'celery-fence\[prometheus\]'"):
        FenceMetrics()


@pytest.mark.parametrize("port", [0, 70000, "9100", True, 1.5])
def test_a_bad_metrics_port_is_refused_naming_the_setting(port: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence_metrics_port must be a TCP port"):
        FenceConfig.from_conf({"fence_metrics_port": port})


@pytest.mark.parametrize("registry", ["REGISTRY", 3, object()])
def test_a_registry_that_is_not_one_is_refused_naming_the_fix(registry: object) -> None:
    with pytest.raises(ConfigurationError, match="CollectorRegistry"):
        FenceMetrics(registry=registry)


def test_connect_refuses_what_is_not_a_celery_app() -> None:
    with pytest.raises(ConfigurationError, match="Celery app"):
        FenceMetrics().connect("shop")


def _prepare_in_a_fresh_process(
    first: str, env: dict[str, str], then: str = ""
) -> subprocess.CompletedProcess[str]:
    prepare = "from celery_fence.metrics import prepare_multiprocess\nprint(prepare_multiprocess())"
    code = f"{first}\n{prepare}\n{then}"
    environ = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"} | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ, check=False
    )


def test_multiprocess_mode_takes_a_fresh_folder_or_the_users(tmp_path: Path) -> None:
    done = _prepare_in_a_fresh_process("", {})
    assert done.returncode == 0, done.stderr
    created = Path(done.stdout.strip())
    assert created.name.startswith("celery-fence-metrics-")
    created.rmdir()
    folder = tmp_path / "metrics"
    imported_after = _prepare_in_a_fresh_process("", {"PROMETHEUS_MULTIPROC_DIR": str(folder)})
    assert (imported_after.returncode, imported_after.stdout.strip()) == (0, "None")  # the user's folder


def test_prometheus_imported_before_the_folder_was_set_still_gives_multiprocess_values() -> None:
    """Flower's ``celery.commands`` plugin imports prometheus_client when the ``celery`` program starts."""
    check = "import prometheus_client.values as v; print(v.ValueClass._multiprocess)"
    done = _prepare_in_a_fresh_process("import prometheus_client", {}, then=check)
    assert done.returncode == 0, done.stderr
    created, multiprocess = done.stdout.split()
    Path(created).rmdir()
    assert multiprocess == "True"


class CountingStore:
    """A memory store that records the name of every call made to it: the round trips a run makes."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return found(*args, **kwargs)

        return call


def calls_of_three_runs(clock: FakeClock, connected: bool) -> list[str]:
    """The store calls of one run, its duplicate and a takeover, with metrics connected or not."""
    app = make_app(f"counted-{connected}", clock)
    store = CountingStore(MemoryStore(clock=clock))
    runtime_for(app)._store = store  # type: ignore[assignment]
    metrics = FenceMetrics(CollectorRegistry()).connect(app) if connected else None
    charge = fenced(app)
    charge.apply((1,))
    charge.apply((1,))
    store._store.acquire("order:2", "a dead worker", 5.0)
    clock.advance(7.5)
    charge.apply((2,))
    if metrics is not None:
        metrics.disconnect()
        assert value(metrics, "takeover_total", task="unit.charge") == 1  # it counted
    runtime_for(app).close()
    return store.calls


def test_metrics_add_no_store_round_trip(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    without = calls_of_three_runs(clock, connected=False)
    assert "acquire" in without
    assert calls_of_three_runs(clock, connected=True) == without
