"""Which key a run takes: the message header, else the task's ``fence_key`` option, else the task id."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_fence._delivery import derive_key
from celery_fence.errors import ConfigurationError, FenceError, InvalidArgument


def charge(invoice_id: int, currency: str = "EUR", *, note: str = "") -> None:
    """The task body the fake task runs (its signature is what a template binds to)."""


def fake_task(fence_key: Any = None, header: str | None = None, task_id: str = "task-id-1") -> Any:
    request = SimpleNamespace(id=task_id, fence_key=header)
    return SimpleNamespace(request=request, fence_key=fence_key, name="shop.charge", run=charge)


def test_default_key_is_the_task_id() -> None:
    assert derive_key(fake_task(), (1,), {}) == ("task-id-1", True)


def test_a_request_without_a_fence_key_attribute_uses_the_task_id() -> None:
    task = fake_task()
    task.request = SimpleNamespace(id="abc")
    assert derive_key(task, (1,), {}) == ("abc", True)


def test_a_template_formats_the_bound_arguments() -> None:
    task = fake_task("invoice:{invoice_id}")
    assert derive_key(task, (42,), {}) == ("invoice:42", False)
    assert derive_key(task, (), {"invoice_id": 43}) == ("invoice:43", False)


def test_a_template_sees_defaults_and_keyword_arguments() -> None:
    task = fake_task("{invoice_id}:{currency}:{note}")
    assert derive_key(task, (1,), {})[0] == "1:EUR:"
    assert derive_key(task, (1, "USD"), {"note": "x"})[0] == "1:USD:x"
    assert derive_key(task, (), {"invoice_id": 2, "currency": "CHF"})[0] == "2:CHF:"


def test_a_template_ignores_arguments_it_does_not_name() -> None:
    task = fake_task("invoice:{invoice_id}")
    assert derive_key(task, (1, "USD"), {"note": "a"}) == derive_key(task, (1, "EUR"), {"note": "b"})


def test_a_callable_gets_the_arguments() -> None:
    seen: list[Any] = []

    def key(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return f"inv-{args[0]}-{kwargs['note']}"

    assert derive_key(fake_task(key), (5,), {"note": "n"}) == ("inv-5-n", False)
    assert seen == [((5,), {"note": "n"})]


def test_the_message_header_wins() -> None:
    called: list[bool] = []

    def key(*args: Any, **kwargs: Any) -> str:
        called.append(True)
        return "from-callable"

    task = fake_task(key, header="from-header")
    assert derive_key(task, (1,), {}) == ("from-header", False)
    assert called == []
    assert derive_key(fake_task("invoice:{invoice_id}", header="h"), (1,), {}) == ("h", False)


def test_a_template_naming_a_missing_argument_names_the_task() -> None:
    with pytest.raises(ConfigurationError, match=r"shop\.charge") as info:
        derive_key(fake_task("order:{order_id}"), (1,), {})
    assert "order:{order_id}" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_positional_template_field_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"shop\.charge"):
        derive_key(fake_task("order:{0}"), (1,), {})


def test_arguments_that_do_not_bind_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"shop\.charge"):
        derive_key(fake_task("invoice:{invoice_id}"), (1, "EUR", "extra"), {})


def test_a_fence_key_of_the_wrong_type_names_the_task() -> None:
    with pytest.raises(ConfigurationError, match=r"shop\.charge"):
        derive_key(fake_task(42), (1,), {})


def test_an_empty_derived_key_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        derive_key(fake_task("{currency}"), (1, ""), {})
    with pytest.raises(InvalidArgument):
        derive_key(fake_task(lambda *a, **k: ""), (1,), {})
    with pytest.raises(InvalidArgument):
        derive_key(fake_task(header=""), (1,), {})


def test_a_too_long_derived_key_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        derive_key(fake_task("{currency}"), (1, "x" * 1025), {})


def test_a_callable_returning_a_non_str_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        derive_key(fake_task(lambda *a, **k: 7), (1,), {})


def test_a_malformed_template_is_a_configuration_error() -> None:
    with pytest.raises(FenceError, match=r"shop\.charge"):
        derive_key(fake_task("invoice:{invoice_id"), (1,), {})


def test_a_callable_fence_key_on_a_real_celery_task_gets_the_arguments_not_the_task() -> None:
    from celery import Celery

    from celery_fence import FencedTask

    app = Celery("keys", set_as_current=False)

    @app.task(base=FencedTask, bind=True, shared=False, fence_key=lambda order_id, **_: f"order:{order_id}")
    def ship(self: Any, order_id: int, express: bool = False) -> None: ...

    @app.task(
        base=FencedTask, bind=True, shared=False, fence_key=staticmethod(lambda order_id: f"o:{order_id}")
    )
    def pack(self: Any, order_id: int) -> None: ...

    for proxy, expected in ((ship, "order:7"), (pack, "o:7")):
        task = app.tasks[proxy.name]  # what a worker calls: the task itself, not the lazy proxy
        task.push_request(id="task-id-7")
        try:
            assert derive_key(task, (7,), {}) == (expected, False)
        finally:
            task.pop_request()
