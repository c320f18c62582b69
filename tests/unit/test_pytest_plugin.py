"""celery-fence's pytest plugin as a user's project sees it: loaded by its entry point beside pytest-celery's,
``fence_*`` fixtures only, the opt-out, the ``pytest_plugins`` line, and the in-process worker it starts."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import celery.contrib.pytest
import pytest
import pytest_celery.plugin
from _pytest.fixtures import getfixturemarker
from celery import Celery

from celery_fence import testing
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import _pytest_plugin, in_process_worker

ROOT = Path(__file__).resolve().parents[2]
USER_FILE = ROOT / "example_app" / "tests" / "test_in_process.py"  # docs/testing.md shows it whole


def fixture_names(module: ModuleType) -> set[str]:
    names = set()
    for attr, value in vars(module).items():
        marker = getfixturemarker(value)
        if marker is not None:
            names.add(marker.name or attr)
    return names


def test_the_entry_point_loads_the_plugin_as_celery_fence() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins["celery_fence"] == "celery_fence.testing._pytest_plugin"
    assert plugins["celery"] == "pytest_celery.plugin"  # pytest-celery's, on beside it


def test_every_fixture_is_named_fence_and_none_is_pytest_celerys() -> None:
    ours = fixture_names(_pytest_plugin)
    assert {"fence_store", "fence_celery_config", "fence_in_process_worker", "fence_worker"} <= ours
    assert sorted(name for name in ours if not name.startswith("fence_")) == []
    assert ours & (fixture_names(pytest_celery.plugin) | fixture_names(celery.contrib.pytest)) == set()
    assert fixture_names(testing) == set()  # else pytest_plugins = [testing] would define them twice


def test_the_docs_in_process_file_passes_in_a_project_of_its_own(pytester: pytest.Pytester) -> None:
    """No conftest, no pytest_plugins line: the entry points load both plugins, as in a user's project."""
    pytester.makepyfile(test_in_process=USER_FILE.read_text())
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


def test_no_celery_fence_turns_the_plugin_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_it(fence_store):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:celery_fence")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'fence_store' not found*"])


def test_with_autoload_off_p_celery_fence_loads_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("def test_it(fence_store):\n    pass\n")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_subprocess("-p", "celery_fence")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("environ", "args", "outcome"),
    [
        ({}, (), {"passed": 1}),  # the entry point and the line: registered once
        ({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, (), {"passed": 1}),  # the line alone
        ({}, ("-p", "no:celery_fence"), {"errors": 1}),  # the opt-out wins over the line
    ],
)
def test_the_pytest_plugins_line_keeps_working(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    environ: dict[str, str],
    args: tuple[str, ...],
    outcome: dict[str, int],
) -> None:
    pytester.makeconftest('pytest_plugins = ["celery_fence.testing"]\n')
    pytester.makepyfile(
        "def test_it(fence_store, fence_celery_config):\n"
        "    assert fence_celery_config['fence_store_url'] == fence_store.url == 'memory://'\n"
    )
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(**outcome)


def test_a_worker_on_an_app_without_the_fence_settings_fails_saying_what_to_merge(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_it(celery_app, fence_in_process_worker):\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*merge fence_celery_config into your celery_config fixture*"])


def test_the_in_process_worker_leaves_the_lent_store_open_and_the_root_logger_as_it_was() -> None:
    closed: list[bool] = []
    store = MemoryStore()
    store.close = lambda: closed.append(True)  # type: ignore[method-assign]
    app = Celery("lent", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.broker_transport_options = {"polling_interval": 0.01}  # kombu's 1 s would slow the stop
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    with in_process_worker(app, store=store):
        pass
    assert closed == []
    assert "_celery_fence_runtime" not in vars(app)  # the app's next worker starts afresh
    assert (root.level, root.handlers) == (level, handlers)


def test_a_store_fault_that_never_fired_fails_the_test(pytester: pytest.Pytester) -> None:
    """A memory store's run has no transaction, so a ``commit`` fault cannot fire: the test is an error."""
    pytester.makepyfile(
        "import pytest\n"
        "from celery_fence.testing import Fault\n\n"
        "@pytest.fixture\n"
        "def celery_config(fence_celery_config):\n"
        "    return fence_celery_config\n\n"
        "@pytest.mark.parametrize('fence_store_faults', [[Fault('lost', method='commit')]])\n"
        "def test_it(fence_in_process_worker):\n"
        "    pass\n"
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*fence_store_faults never fired*method='commit'*"])


INVOICES = ROOT / "example_app" / "invoices"  # a user's @app.task app and its tests, docs/testing.md
UNREACHABLE = {  # the app's production settings, pointed where nothing answers: a test that used them fails
    "INVOICES_BROKER_URL": "redis://127.0.0.1:9/0",
    "INVOICES_RESULT_BACKEND": "redis://127.0.0.1:9/1",
    "INVOICES_STORE_URL": "postgresql://127.0.0.1:9/invoices",
}


def copy_project(pytester: pytest.Pytester, *names: str) -> None:
    for name in names:
        (pytester.path / name).write_text((INVOICES / name).read_text())


def test_a_users_own_app_runs_in_process_with_no_broker_and_no_store_of_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/testing.md's in-process files for an @app.task app, in an empty project: they pass although
    the app's broker, result backend and store do not answer."""
    copy_project(pytester, "invoices.py", "conftest.py", "test_invoices.py")
    for name, value in UNREACHABLE.items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_a_task_sent_through_an_app_not_under_test_fails_the_test_naming_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``fence_app``, ``charge.delay()`` goes to the app's own broker, not to the in-process worker:
    the test fails saying so, also when a live worker there would have answered."""
    copy_project(pytester, "invoices.py")
    monkeypatch.setenv("INVOICES_BROKER_URL", "memory://")  # it accepts the message; nobody runs it
    pytester.makepyfile(
        "from invoices import charge\n\n"
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def celery_config(fence_celery_config):\n"
        "    return fence_celery_config\n\n"
        "def test_it(fence_in_process_worker):\n"
        "    charge.delay(1)\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*sent through an app that is not the one under test: invoices.charge (on app 'invoices', broker "
            "'memory://*')*return that app from a fence_app fixture*"
        ]
    )


def test_the_testing_module_exports_only_its_public_names() -> None:
    """Neither ``pytest`` nor ``annotations`` (the ``__future__`` feature) is a name of
    ``celery_fence.testing``, in ``dir()`` or through ``import *``; what it shows is ``__all__`` and the
    two names pytest looks up on a plugin module."""
    # (pytest's assertion rewriting adds "@py_builtins" and "@pytest_ar" to a plugin module: not names; an
    # imported submodule such as ``contract`` is an attribute of the package, and public)
    shown = {
        name
        for name in dir(testing)
        if name.isidentifier()
        and not name.startswith("_")
        and not getattr(getattr(testing, name), "__name__", "").startswith("celery_fence.testing.")
    }
    assert shown == {*testing.__all__, "PLUGIN_NAME", "pytest_configure"}
    star: dict[str, object] = {}
    exec("from celery_fence.testing import *", star)  # what a user's star import gets
    assert set(star) - {"__builtins__"} == set(testing.__all__)


def test_the_app_under_test_gets_its_settings_and_the_current_app_back() -> None:
    """What ``fence_app`` promises after each test: the user's app is on its own settings again (a setting
    it never had is gone), and the current app is the one before."""
    from celery import current_app

    from celery_fence.testing._app_under_test import app_under_test

    app = Celery("own", broker="redis://127.0.0.1:9/3", backend="redis://127.0.0.1:9/4", set_as_current=False)
    app.conf.fence_lease_ttl = 30
    before = current_app._get_current_object()
    with app_under_test(app, {"fence_store_url": "memory://", "fence_lease_ttl": 3}):
        assert current_app._get_current_object() is app
        assert (app.conf.broker_url, app.conf.result_backend) == ("memory://", "cache+memory://")
        assert (app.conf.fence_lease_ttl, app.conf.fence_store_url) == (3, "memory://")
    assert current_app._get_current_object() is before
    assert (app.conf.broker_url, app.conf.result_backend) == (
        "redis://127.0.0.1:9/3",
        "redis://127.0.0.1:9/4",
    )
    assert app.conf.fence_lease_ttl == 30 and "fence_store_url" not in app.conf
