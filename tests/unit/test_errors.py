"""The exception tree: one root, the documented stdlib bases, readable messages, an honest ``__all__``."""

from __future__ import annotations

import builtins
import inspect
import pickle
import re

import pytest

import celery_fence
from celery_fence import errors
from celery_fence.errors import (
    AlreadyDone,
    ConfigurationError,
    FailedBefore,
    FenceError,
    InvalidArgument,
    LeaseHeld,
    LeaseLost,
    NotSerializable,
    StaleToken,
)

TREE_LINE = re.compile(r"^\s*[├└]── (\w+)(?: \((\w+)\))?", re.MULTILINE)
TREE_ROOT = re.compile(r"^\s+(\w+)\n\s+├──", re.MULTILINE)


def _tree() -> dict[str, str | None]:
    """``{class name: stdlib base named in parentheses or None}`` as drawn in the module docstring."""
    assert errors.__doc__ is not None
    return {name: base or None for name, base in TREE_LINE.findall(errors.__doc__)}


@pytest.mark.parametrize("name", errors.__all__)
def test_every_public_class_derives_from_fence_error(name: str) -> None:
    cls = getattr(errors, name)
    assert isinstance(cls, type)
    assert issubclass(cls, FenceError)


def test_the_docstring_tree_names_every_class() -> None:
    drawn = _tree()
    root = TREE_ROOT.search(errors.__doc__ or "")
    assert root is not None and root.group(1) == "FenceError"
    assert set(drawn) | {"FenceError"} == set(errors.__all__)


def test_the_docstring_tree_shows_the_real_stdlib_bases() -> None:
    for name, base in _tree().items():
        cls = getattr(errors, name)
        if base is not None:
            assert issubclass(cls, getattr(builtins, base)), name
        else:
            assert not issubclass(cls, (ValueError, TypeError)), name


def test_bad_settings_and_input_are_value_errors_an_unserializable_result_a_type_error() -> None:
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(NotSerializable, TypeError)


def test_lease_held_fields_and_message() -> None:
    exc = LeaseHeld("order:7", "host:1:abc", 12.345)
    assert (exc.key, exc.owner, exc.expires_in) == ("order:7", "host:1:abc", 12.345)
    assert str(exc) == "lease 'order:7' is held by host:1:abc, expires in 12.3s"


def test_lease_held_without_expiry() -> None:
    exc = LeaseHeld("k")
    assert exc.owner is None and exc.expires_in is None
    assert str(exc) == "lease 'k' is held by None"


def test_already_done_fields_and_message() -> None:
    exc = AlreadyDone("k", 4, {"total": 3})
    assert (exc.key, exc.token, exc.result) == ("k", 4, {"total": 3})
    assert str(exc) == "key 'k' was completed with token 4"


def test_failed_before_fields_and_message_and_it_survives_celerys_transport() -> None:
    exc = FailedBefore("k", 0, "shop.ship[t-1] ended FAILURE (RuntimeError)")
    assert (exc.key, exc.token, exc.reason) == ("k", 0, "shop.ship[t-1] ended FAILURE (RuntimeError)")
    assert str(exc) == (
        "key 'k': this task id ended FAILURE in an earlier run "
        "(shop.ship[t-1] ended FAILURE (RuntimeError)); a copy of it runs nothing and ends the same way: "
        "send a new task to run it again"
    )
    again = pickle.loads(pickle.dumps(exc))
    assert (type(again), again.args, str(again)) == (FailedBefore, exc.args, str(exc))


def test_lease_lost_fields_and_message() -> None:
    exc = LeaseLost("k", 9, "renew refused")
    assert (exc.key, exc.token, exc.reason) == ("k", 9, "renew refused")
    assert str(exc) == "renew refused: key 'k', token 9"
    assert LeaseLost("k", 9).reason == "lease lost"


def test_stale_token_fields_and_message() -> None:
    exc = StaleToken("k", 3, 5, "complete")
    assert (exc.key, exc.token, exc.current, exc.what) == ("k", 3, 5, "complete")
    assert str(exc) == "complete refused for key 'k': token 3 is stale (current: 5)"
    unknown = StaleToken("k", 3)
    assert unknown.current is None and unknown.what == "write"
    assert str(unknown) == "write refused for key 'k': token 3 is stale (current: unknown)"


def test_package_all_is_sorted_and_every_name_exists() -> None:
    names = celery_fence.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(celery_fence, name), name


def test_package_all_names_every_public_name() -> None:
    """Nothing public is left out: every non-underscore name but submodules and ``annotations``."""
    public = {
        name
        for name, value in vars(celery_fence).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert public == set(celery_fence.__all__)


def test_package_exports_every_public_exception() -> None:
    for name in errors.__all__:
        assert name in celery_fence.__all__, name
        assert getattr(celery_fence, name) is getattr(errors, name)
