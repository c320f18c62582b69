"""The store contract suite as a third party runs it (docs/stores.md, "Run the contract suite on it"): the
page's two files, in a pytester project of their own, pass the whole shipped suite on a toy store; a store
with the run role only passes the run role and skips the rest, saying why; no fixture is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _pytest.fixtures import getfixturemarker

import celery_fence.testing.contract as suite
from celery_fence.testing import _contract_plugin

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(r"^<!-- contract-example: (\S+) -->\n```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)

RUN_ONLY_CONFTEST = '''
import pytest
from celery_fence.stores.base import RunStore
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock, StoreHarness

RUN_METHODS = {name for name in vars(RunStore) if not name.startswith("_")} | {"url", "max_value_bytes"}


class RunOnly:
    """A memory store that shows only the run role."""

    def __init__(self):
        self.memory = MemoryStore("run-only://", clock=FakeClock())

    def __getattr__(self, name):
        if name not in RUN_METHODS:
            raise AttributeError(name)
        return getattr(self.memory, name)


def open_store(request):
    yield RunOnly()


@pytest.fixture
def fence_contract_harness():
    return StoreHarness(
        "run-only", open_store, lambda store: store.memory.clock.advance(10_000), multiprocess=False
    )
'''


def example_files() -> dict[str, str]:
    return dict(EXAMPLE.findall((ROOT / "docs" / "stores.md").read_text()))


def test_the_docs_toy_store_passes_the_whole_suite_with_one_fixture(pytester: pytest.Pytester) -> None:
    files = example_files()
    assert sorted(files) == ["conftest.py", "test_fence_contract.py"]
    pytester.makeconftest(files["conftest.py"])
    pytester.makepyfile(test_fence_contract=files["test_fence_contract.py"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert set(outcomes) == {"passed"}, result.stdout.str()[-3000:]
    assert outcomes["passed"] > len(suite.__all__)  # every test, most of them parametrized


def test_a_run_only_store_passes_the_run_role_and_skips_the_others(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RUN_ONLY_CONFTEST)
    pytester.makepyfile(test_fence_contract="from celery_fence.testing.contract import *  # noqa: F403\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    assert set(result.parseoutcomes()) == {"passed", "skipped"}, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*run-only has no AuditStore, AdminStore, RecoveryStore role*"])
    pytester.makepyfile(
        test_fence_contract="from celery_fence.testing.contract.run_role import *  # noqa: F403\n"
    )
    run_role = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert set(run_role.parseoutcomes()) == {"passed"}, run_role.stdout.str()[-3000:]


def test_without_the_fixture_the_suite_says_what_to_define(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fence_contract="from celery_fence.testing.contract.run_role import test_acquire_free_key\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs a fence_contract_harness fixture returning*StoreHarness*"])


def test_the_suite_exports_its_tests_only_and_each_name_once() -> None:
    defined = [
        name
        for module in suite.MODULES
        for name, value in vars(module).items()
        if name.startswith("test_") and value.__module__ == module.__name__
    ]
    assert sorted(defined) == suite.__all__  # no test shadows another of the same name
    assert all(name.startswith("test_") for name in suite.__all__)


def test_the_contract_fixtures_are_named_fence() -> None:
    markers = {attr: getfixturemarker(value) for attr, value in vars(_contract_plugin).items()}
    names = {marker.name or attr for attr, marker in markers.items() if marker is not None}
    assert names == {f"fence_contract_{n}" for n in ("harness", "store", "expire", "seeded")}
