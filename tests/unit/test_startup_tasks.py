"""The startup check's look at names and at each fenced task: misspelt
``fence_*`` settings and task options, acknowledgement settings judged per task, ``fence_key`` templates
checked against the task's signature. Pure: an app object, no worker, no store."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_fence import ConfigurationError, FencedTask
from celery_fence.config import TASK_OPTIONS
from celery_fence.worker.startup import check_settings, check_worker_at_start

SAFE: dict[str, Any] = {"task_acks_late": True, "task_reject_on_worker_lost": True}


def _body(self: Any, item: Any, count: int = 1) -> Any:
    return item


def fenced(conf: dict[str, Any] | None = None, **tasks: dict[str, Any]) -> tuple[Celery, list[Any]]:
    """An app with ``conf`` over ``SAFE`` and a fenced task per keyword (its name: its options)."""
    app = Celery("checks", set_as_current=False)
    app.conf.update({**SAFE, **(conf or {})})
    for name, options in tasks.items():
        app.task(base=FencedTask, bind=True, name=name, shared=False, **options)(_body)
    app.finalize()
    return app, [app.tasks[name] for name in tasks]


def warnings_of(conf: dict[str, Any] | None = None, **tasks: dict[str, Any]) -> list[str]:
    app, bound = fenced(conf, **tasks)
    return check_settings(app.conf, tasks=bound)


def test_misspelt_settings_warn_naming_the_closest_valid_one() -> None:
    warnings = check_settings({**SAFE, "fence_lease_tll": 60, "fence_on_bussy": "ignore"})
    assert warnings == [
        "unknown setting fence_lease_tll (did you mean fence_lease_ttl?): celery-fence ignores it",
        "unknown setting fence_on_bussy (did you mean fence_on_busy?): celery-fence ignores it",
    ]


def test_an_upper_case_setting_is_not_read_and_says_so() -> None:
    (warning,) = check_settings({**SAFE, "FENCE_LEASE_TTL": 60})
    assert warning.startswith("unknown setting FENCE_LEASE_TTL (did you mean fence_lease_ttl?)")


class DjangoSettings:
    """What ``django.conf:settings`` holds: upper-case names, Celery's under its ``CELERY_`` namespace."""

    CELERY_TASK_ACKS_LATE = True
    CELERY_TASK_REJECT_ON_WORKER_LOST = True
    CELERY_FENCE_LEASE_TTL = 60
    CELERY_FENCE_STORE_URL = "memory://"
    CELERY_FENCE_ON_BUSSY = "ignore"


def test_a_misspelt_setting_in_a_celery_namespace_warns_as_written(caplog: pytest.LogCaptureFixture) -> None:
    """``app.config_from_object("django.conf:settings", namespace="CELERY")``: Celery reads
    ``CELERY_FENCE_LEASE_TTL`` as ``fence_lease_ttl``, and a misspelt one is named as the user wrote it,
    by the worker's start-up check."""
    app = Celery("django", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    app.task(base=FencedTask, bind=True, name="t", shared=False, fence_key="item:{item}")(_body)
    app.finalize()
    assert app.conf.get("fence_lease_ttl") == 60
    with caplog.at_level(logging.WARNING, logger="celery_fence"):
        check_worker_at_start(sender=SimpleNamespace(app=app, pool_cls=None), fenced=FencedTask)
    warnings = [r.getMessage() for r in caplog.records if "unknown setting" in r.getMessage()]
    assert warnings == [
        "celery-fence: unknown setting CELERY_FENCE_ON_BUSSY (did you mean CELERY_FENCE_ON_BUSY?): "
        "celery-fence ignores it"
    ]


def test_a_fence_setting_like_no_other_warns_without_a_guess() -> None:
    assert check_settings({**SAFE, "fence_xyz": 1}) == ["unknown setting fence_xyz: celery-fence ignores it"]


def test_every_known_setting_and_task_option_is_no_warning() -> None:
    options = {"fence_key": "item:{item}", "fence_lease_ttl": 60, "fence_on_busy": "fail"}
    conf = {"fence_store_wait": 10, "fence_recover": False, "fence_send_events": False}
    assert warnings_of(conf, a={**options, "fence_interrupt": True}) == []


def test_a_misspelt_task_option_warns_naming_the_closest_task_option() -> None:
    assert warnings_of(charge={"fence_ttl": 120}) == [
        "task charge: unknown option fence_ttl (did you mean fence_lease_ttl?): celery-fence ignores it"
    ]


def test_an_app_setting_given_to_a_task_says_it_has_no_per_task_form() -> None:
    (warning,) = warnings_of(charge={"fence_renew_interval": 1.0})
    assert warning.startswith("task charge: fence_renew_interval is an app setting with no per-task form")


def test_a_misspelt_option_set_on_a_task_instance_warns_too() -> None:
    app, (task,) = fenced(charge={})
    task.fence_on_bussy = "fail"
    (warning,) = check_settings(app.conf, tasks=[task])
    assert "unknown option fence_on_bussy (did you mean fence_on_busy?)" in warning


def test_fenced_task_itself_declares_the_task_options_and_no_other_fence_name() -> None:
    """The check walks a task's classes up to Celery's ``Task``, ``FencedTask`` included: its own
    ``fence_*`` names must be the task options, or every fenced task would warn."""
    assert sorted(n for n in vars(FencedTask) if n.lower().startswith("fence_")) == sorted(TASK_OPTIONS)


def test_a_misspelt_option_on_a_base_class_of_the_task_warns_too() -> None:
    class Base(FencedTask):  # type: ignore[misc]
        abstract = True
        fence_on_bussy = "fail"

    app = Celery("checks", set_as_current=False)
    app.conf.update(SAFE)
    app.task(base=Base, bind=True, name="charge", shared=False)(_body)
    app.finalize()
    (warning,) = check_settings(app.conf, tasks=[app.tasks["charge"]])
    assert "task charge: unknown option fence_on_bussy (did you mean fence_on_busy?)" in warning


def test_acks_late_on_the_task_is_enough_without_the_app_setting() -> None:
    assert warnings_of({"task_acks_late": False}, charge={"acks_late": True}) == []


def test_acks_late_off_on_one_task_warns_naming_that_task_only() -> None:
    (warning,) = warnings_of(charge={"acks_late": False}, ship={})
    assert warning.startswith("task_acks_late is off for charge:")


def test_reject_on_worker_lost_on_the_task_is_enough() -> None:
    conf = {"task_reject_on_worker_lost": False}
    assert warnings_of(conf, charge={"reject_on_worker_lost": True}) == []
    (warning,) = warnings_of(conf, charge={})
    assert "task_reject_on_worker_lost or task_retry_on_worker_lost for charge:" in warning


def test_a_warning_names_five_tasks_and_counts_the_rest() -> None:
    (warning,) = warnings_of({"task_acks_late": False}, **{f"t{i}": {} for i in range(7)})
    assert warning.startswith("task_acks_late is off for t0, t1, t2, t3, t4 and 2 more:")


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("item:{itme}", "names {itme}, which is not a parameter of the task (did you mean item?)"),
        ("invoice:{}", "names a positional field {}"),
        ("invoice:{0}", "names a positional field {0}"),
        ("invoice:{item", "is not a format string"),
        ("{item:{width}}", "names {width}"),
    ],
)
def test_a_fence_key_the_signature_cannot_fill_is_refused_naming_task_and_field(key: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^task charge: fence_key ") as refused:
        warnings_of(charge={"fence_key": key})
    assert says in str(refused.value)


@pytest.mark.parametrize("key", ["item:{item}:{count}", "item:{item.id}", "item:{item[0]}", "{count:>4}"])
def test_a_fence_key_naming_parameters_is_accepted(key: str) -> None:
    assert warnings_of(charge={"fence_key": key}) == []


def test_a_fence_key_that_is_neither_a_string_nor_a_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="fence_key must be a format string or a callable"):
        warnings_of(charge={"fence_key": 7})


@pytest.mark.parametrize(
    ("url", "named"), [("redis://127.0.0.1:6379/0", "Redis"), ("etcd://127.0.0.1:2379", "etcd")]
)
def test_fence_mode_commit_stops_the_worker_on_a_store_without_sql_transactions(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        warnings_of({"fence_store_url": url}, ship={"fence_mode": "commit"}, other={})
    message = str(refused.value)
    assert message.startswith("ship: fence_mode='commit' is not available on " + named)
    assert "PostgreSQL or SQLite" in message and "fence_mode='lease'" in message
    with pytest.raises(ConfigurationError, match="the app: fence_mode='commit'"):
        check_settings({**SAFE, "fence_store_url": url, "fence_mode": "commit"})


def test_fence_mode_commit_on_the_memory_store_warns_that_it_is_emulated() -> None:
    found = warnings_of({"fence_store_url": "memory://"}, ship={"fence_mode": "commit"}, other={})
    assert found == [
        "fence_mode='commit' on memory is emulated (ship): its claim is atomic, but there is no database "
        "transaction for the task's writes to commit with"
    ]


def test_fence_mode_commit_on_sqlite_and_postgresql_is_no_warning(tmp_path: Any) -> None:
    for url in (f"sqlite:///{tmp_path}/fence.db", "postgresql+psycopg://h/db"):
        assert warnings_of({"fence_store_url": url}, ship={"fence_mode": "commit"}) == []


def test_an_unknown_fence_mode_is_refused_naming_both() -> None:
    refusal = r"fence_mode must be one of \('lease', 'commit'\), got 'comit'"
    with pytest.raises(ConfigurationError, match=refusal):
        check_settings({**SAFE, "fence_mode": "comit"})
