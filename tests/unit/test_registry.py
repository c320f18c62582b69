"""Choosing a store by URL: built-in schemes, lazy drivers with a helpful fix, third-party entry points."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from celery_fence import open_store, stores
from celery_fence.errors import ConfigurationError
from celery_fence.lease import Lease
from celery_fence.stores.memory import MemoryStore


def test_memory_url_gives_a_memory_store() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert store.url == "memory://"


def test_each_memory_store_has_its_own_state() -> None:
    first, second = open_store("memory://"), open_store("memory://")
    first.acquire("k", "o", 30)
    assert first.get("k") is not None
    assert second.get("k") is None
    assert second.acquire("k", "other", 30) == Lease("k", 1, "other")


def test_the_scheme_is_case_insensitive() -> None:
    assert isinstance(open_store("MEMORY://"), MemoryStore)


@pytest.mark.parametrize("url", ["nosuchstore://host/db", "mysql://localhost/x", "://nothing"])
def test_an_unknown_scheme_names_the_known_ones(url: str) -> None:
    with pytest.raises(ConfigurationError, match="unknown fence store scheme") as info:
        open_store(url)
    message = str(info.value)
    for scheme in ("etcd", "memory", "postgresql", "redis", "rediss", "sqlite"):
        assert scheme in message
    assert "celery_fence.stores" in message


@pytest.mark.parametrize("url", ["memory", "localhost:6379", "", "sqlite:/x.db", None, 42, b"memory://"])
def test_a_malformed_url_is_a_configuration_error(url: Any) -> None:
    with pytest.raises(ConfigurationError, match="must be a URL"):
        open_store(url)


def _without(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    """Make ``missing`` not installed for this test: not importable, not found, and no store module that
    imported it still cached."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == missing else real(name, *a, **k)
    )
    monkeypatch.setitem(sys.modules, missing, None)  # ``import missing`` raises ModuleNotFoundError
    for name in [n for n in sys.modules if n.startswith("celery_fence.stores.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("redis://localhost:6379/0", "redis", "redis"),
        ("rediss://localhost:6380/0", "redis", "redis"),
        ("postgresql://localhost/db", "psycopg", "postgres"),
        ("postgresql+psycopg://localhost/db", "psycopg", "postgres"),
        ("postgres://localhost/db", "psycopg", "postgres"),
    ],
)
def test_a_missing_extra_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, url: str, module: str, extra: str
) -> None:
    _without(monkeypatch, module)
    with pytest.raises(ConfigurationError) as info:
        open_store(url)
    assert f"pip install 'celery-fence[{extra}]'" in str(info.value)
    assert repr(module) in str(info.value)


def test_a_third_party_stores_missing_driver_names_the_extra_its_entry_point_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def load() -> Any:
        raise ModuleNotFoundError("No module named 'fancydb'", name="fancydb")

    entry = _FakeEntryPoint("fancy", None, module="fancy_fence.store", extras=["fancy"])
    entry.load = load  # type: ignore[method-assign]
    _register(monkeypatch, entry)
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'celery-fence[fancy]'")):
        open_store("fancy://host/db")


def test_every_built_in_store_is_in_the_one_registry() -> None:
    """The entry point group is the only table of schemes: built-in stores are registered there too."""
    names = {ep.name: ep.value.split(" ")[0] for ep in entry_points(group="celery_fence.stores")}
    assert {"memory", "sqlite", "postgresql", "postgres", "redis", "rediss", "etcd"} <= set(names)
    urls = ["memory://", "sqlite:///x.db", "postgresql://h/db", "redis://h:6379/0", "etcd://h:2379"]
    for url in urls:
        assert stores.store_class(url).__name__ == names[url.split(":")[0]].rsplit(":", 1)[1]


def test_the_etcd_store_needs_nothing_beyond_the_standard_library() -> None:
    """Its client is http.client: it opens (and would run) with ``requests`` not importable."""
    code = (
        "import sys; sys.modules['requests'] = None\n"
        "from celery_fence import open_store\n"
        "from celery_fence.stores import store_class\n"
        "store_class('etcd://localhost:2379')\n"
        "print(open_store('etcd://localhost:2379').__class__.__name__)"  # the store behind its checked front
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "EtcdStore"), done.stderr


def test_a_missing_driver_suffix_module_names_that_package(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "psycopg2")
    with pytest.raises(ConfigurationError, match="pip install psycopg2"):
        open_store("postgresql+psycopg2://localhost/db")


@pytest.mark.parametrize("url", ["postgresql+asyncpg://localhost/db", "postgres+asyncpg://localhost/db"])
def test_asyncpg_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"postgresql\+psycopg://"):
        open_store(url)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused_and_names_memory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="'memory://'"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []


class _FakeEntryPoint:
    def __init__(self, name: str, target: Any, module: str = "third_party", extras: Any = ()) -> None:
        self.name, self._target, self.module, self.extras = name, target, module, list(extras)

    def load(self) -> Any:
        return self._target


class _ThirdPartyStore:
    def __init__(self, url: str, **options: Any) -> None:
        self.url, self.options = url, options


def _register(monkeypatch: pytest.MonkeyPatch, *eps: _FakeEntryPoint) -> list[str]:
    groups: list[str] = []

    def entry_points(*, group: str) -> list[_FakeEntryPoint]:
        groups.append(group)
        return list(eps)

    monkeypatch.setattr(stores, "entry_points", entry_points)
    return groups


def test_a_third_party_store_is_constructed_with_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = _register(
        monkeypatch, _FakeEntryPoint("other", object), _FakeEntryPoint("mystore", _ThirdPartyStore)
    )
    store = open_store("mystore://host:1/x?y=z", timeout=3)
    assert isinstance(store, _ThirdPartyStore)
    assert store.url == "mystore://host:1/x?y=z"
    assert store.options == {"timeout": 3}
    assert groups == ["celery_fence.stores"]


def test_an_entry_point_of_another_name_does_not_match(monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, _FakeEntryPoint("mystore", _ThirdPartyStore))
    with pytest.raises(ConfigurationError, match="unknown fence store scheme 'yourstore'"):
        open_store("yourstore://x")


def test_a_built_in_scheme_is_not_taken_over_by_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    built_in = list(entry_points(group="celery_fence.stores"))
    _register(monkeypatch, *built_in, _FakeEntryPoint("memory", _ThirdPartyStore))
    assert isinstance(open_store("memory://"), MemoryStore)
