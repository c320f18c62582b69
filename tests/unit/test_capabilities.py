"""What each store declares before connecting (``stores.capabilities``), and that nothing outside
``celery_fence/stores/`` branches on which store it is: it asks the store instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from celery_fence.errors import ConfigurationError
from celery_fence.stores import Capabilities, capabilities_for, capabilities_of, store_class
from celery_fence.stores.capabilities import NOTHING_DECLARED
from celery_fence.stores.memory import MemoryStore

PACKAGE = Path(__file__).resolve().parents[2] / "celery_fence"
SCHEMES = {"memory", "sqlite", "postgresql", "postgres", "redis", "rediss", "etcd"}


def test_sqlite_shares_its_database_waits_for_one_lock_and_lives_in_a_file(tmp_path: Path) -> None:
    found = capabilities_for(f"sqlite:///{tmp_path}/fence.db")
    assert (found.name, found.transactions, found.local_file) == ("SQLite", True, tmp_path / "fence.db")
    assert found.write_lock_wait is not None and found.write_lock_wait > 0


def test_postgresql_shares_its_database_and_has_no_file() -> None:
    found = capabilities_for("postgresql+psycopg://127.0.0.1/db")
    assert (found.transactions, found.write_lock_wait, found.local_file) == (True, None, None)
    assert found.default_port == 5432


def test_redis_and_etcd_have_no_transactions_and_etcd_rounds_its_leases() -> None:
    redis, etcd = capabilities_for("redis://127.0.0.1/0"), capabilities_for("etcd://127.0.0.1:2379/x/")
    assert (redis.transactions, redis.default_port) == (False, 6379)
    assert (etcd.transactions, etcd.default_port) == (False, 2379)
    assert (etcd.min_ttl, etcd.whole_second_ttl) == (2, True)
    assert etcd.ttl_warning(1.5) is not None and etcd.ttl_warning(3) is None
    assert redis.ttl_warning(0.5) is None


def test_a_store_that_declares_nothing_gets_the_defaults() -> None:
    class ThirdParty:
        url = "thirdparty://x"

    assert capabilities_of(ThirdParty()) is NOTHING_DECLARED == Capabilities()
    assert capabilities_of(MemoryStore()).name == "memory"


def test_a_sqlite_file_in_a_missing_directory_is_refused_without_opening_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing/fence.db"
    with pytest.raises(ConfigurationError, match="does not exist"):
        store_class(url)
    assert not (tmp_path / "missing").exists()


def _store_kind_branches(path: Path) -> list[str]:
    """``isinstance(x, SomethingStore)`` and comparisons with a store's scheme, in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        called = getattr(node.func, "id", None) if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Call) and called == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            found += [f"{path.name}:{node.lineno}" for k in kinds if getattr(k, "id", "").endswith("Store")]
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
            if any(isinstance(v, ast.Constant) and v.value in SCHEMES for v in values):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_outside_stores_branches_on_which_store_it_is() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if "stores" not in p.relative_to(PACKAGE).parts]
    assert modules
    assert [hit for path in modules for hit in _store_kind_branches(path)] == []
