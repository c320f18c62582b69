"""The store protocol's roles (``stores.base``): what a run, the audit trail, administration and recovery
each need. A store with the run's role only is usable by runs; a ``fence`` command that needs another role
names the one it lacks, and changes nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_fence._runtime import runtime_for
from celery_fence.cli import fence
from celery_fence.stores.base import AdminStore, AuditStore, RecoveryStore, RunStore, Store, lacking
from celery_fence.stores.memory import MemoryStore

ROLES = (RunStore, AuditStore, AdminStore, RecoveryStore)
RUN_METHODS = (
    *("migrate", "acquire", "renew", "complete", "release"),
    *("save_step", "steps", "refuse", "get", "close"),
)


class RunOnly:
    """A third-party store with the run's role only (here, the memory store's)."""

    def __init__(self, inner: MemoryStore) -> None:
        self.url, self.max_value_bytes, self._inner = "thirdparty://x", inner.max_value_bytes, inner
        for name in RUN_METHODS:
            setattr(self, name, getattr(inner, name))


def test_a_built_in_store_has_every_role() -> None:
    store = MemoryStore()
    assert [lacking(store, role) for role in ROLES] == [[], [], [], []]
    assert isinstance(store, Store)


def test_a_store_with_the_runs_role_only_lacks_the_others_by_name() -> None:
    store = RunOnly(MemoryStore())
    assert isinstance(store, RunStore) and not isinstance(store, Store)
    assert lacking(store, RunStore) == []
    assert lacking(store, AdminStore) == ["leases", "force_release", "prune", "advance"]
    assert lacking(store, RecoveryStore) == ["abandoned", "recover", "strand"]
    assert lacking(store, AuditStore) == ["history"]


@pytest.mark.parametrize(
    ("args", "role"),
    [
        (["leases"], "AdminStore"),
        (["release", "k", "--yes"], "AdminStore"),
        (["prune", "--older-than", "7d"], "AdminStore"),
        (["advance", "--gap", "10"], "AdminStore"),
        (["show", "k"], "AuditStore"),
        (["verify"], "AuditStore"),
        (["recover"], "RecoveryStore"),
    ],
)
def test_a_command_names_the_role_its_store_lacks_and_changes_nothing(args: list[str], role: str) -> None:
    app = Celery("roles", set_as_current=False)
    app.conf.update(fence_store_url="memory://", fence_prune_min_age=60)
    inner = MemoryStore()
    runtime = runtime_for(app)
    runtime._store = RunOnly(inner)  # type: ignore[assignment]
    result = CliRunner().invoke(fence, args, obj=SimpleNamespace(app=app))
    assert result.exit_code == 2, result.output
    assert f"needs a store with the {role} role; thirdparty://x lacks" in result.output
    assert inner.history() == []
    runtime._store = None
