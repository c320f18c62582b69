"""Test your own fenced tasks: in Celery's in-process worker, and on real workers against real faults.

Installing celery-fence installs a pytest plugin (entry point ``celery_fence``; ``-p no:celery_fence``
turns it off) whose fixtures are all named ``fence_*``. With pytest-celery (``celery-fence[testing]``), a
test takes its ``celery_app`` and adds the fence::

    import pytest
    from celery_fence import FencedTask
    from celery_fence.testing import assert_history_clean

    @pytest.fixture
    def celery_config(fence_celery_config):   # function scope: the fence store is this test's own
        return {**fence_celery_config}

    def test_an_invoice_is_charged_once(celery_app, fence_in_process_worker, fence_store):
        @celery_app.task(base=FencedTask, bind=True, fence_key="invoice:{invoice_id}")
        def charge(self, invoice_id):
            return self.fence.step("charge", lambda: invoice_id * 100)

        assert charge.delay(7).get(timeout=10) == charge.delay(7).get(timeout=10) == 700
        assert_history_clean(fence_store)

Tasks made with ``@app.task`` on your own app: return that app from a ``fence_app`` fixture, and
``fence_in_process_worker`` runs it in-process, switched to the memory broker and the test's store.

The fault kit starts real ``celery -A <your app> worker`` processes (``fence_worker``) and aims a fault at
the process that runs a task: :func:`paused` past its lease, :func:`kill_mid_run`, :func:`redeliver`, the
store link cut through a :class:`StoreProxy` (``fence_store_proxy``), lost replies from the store
(:class:`IndeterminateStore`, :func:`store_faults_env`); :func:`assert_history_clean` checks the store's
audit trail. See ``docs/testing.md``. ``import celery_fence`` alone never imports pytest; this module does.

A store of your own runs the store contract suite (:mod:`celery_fence.testing.contract`) with one fixture,
``fence_contract_harness``, returning a :class:`StoreHarness` (docs/stores.md).
"""

# No ``from __future__ import annotations`` and no bare ``import pytest``: each would be one more public
# name of this module (``dir()``, tab completion) next to the kit's own, which are ``__all__``.
from pytest import Config as _Config

from . import _pytest_plugin
from ._faults import Worker, free_port, wait_for
from ._harness import StoreHarness
from ._indeterminate import Fault, IndeterminateStore, Outcome
from ._inprocess import in_process_worker
from ._kit import (
    FakeClock,
    StoreProxy,
    assert_history_clean,
    committed,
    kill_mid_run,
    paused,
    redeliver,
    store_faults_env,
)
from ._pytest_plugin import ProxyFactory, WorkerFactory

__all__ = [
    "FakeClock",
    "Fault",
    "IndeterminateStore",
    "Outcome",
    "ProxyFactory",
    "StoreHarness",
    "StoreProxy",
    "Worker",
    "WorkerFactory",
    "assert_history_clean",
    "committed",
    "free_port",
    "in_process_worker",
    "kill_mid_run",
    "paused",
    "redeliver",
    "store_faults_env",
    "wait_for",
]

PLUGIN_NAME = "celery_fence"  # the entry point's name: what -p no:celery_fence blocks


def pytest_configure(config: _Config) -> None:
    """This module was loaded as a plugin (``pytest_plugins = ["celery_fence.testing"]``): register the
    fixtures unless the entry point already did; ``-p no:celery_fence`` still keeps them out."""
    manager = config.pluginmanager
    if not manager.is_registered(_pytest_plugin):
        manager.register(_pytest_plugin, PLUGIN_NAME)
