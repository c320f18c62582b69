"""The library's exceptions survive pickle and Celery's exception transport: a client
waiting on a result gets back the same error, with its fields, as the worker raised."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from celery import Celery

from celery_fence import AlreadyDone, FenceError, LeaseHeld, LeaseLost, StaleToken
from celery_fence.errors import ConfigurationError, InvalidArgument, StoreUnavailable, TokenRewound

ERRORS = [
    LeaseHeld("k", "host:1:abc-1", 4.25),
    LeaseHeld("k"),
    AlreadyDone("k", 7, {"total": [1, 2]}),
    LeaseLost("k", 7, "renew refused"),
    LeaseLost("k", 7),
    StaleToken("k", 7, 9, "complete", recorded=True),
    StaleToken("k", 7),
    StoreUnavailable("store down"),
    InvalidArgument("bad key"),
    ConfigurationError("bad url"),
    TokenRewound("rewound"),
]


def _same(a: BaseException, b: BaseException) -> None:
    assert type(a) is type(b)
    assert str(a) == str(b)
    assert {k: v for k, v in vars(a).items() if not k.startswith("__")} == {
        k: v for k, v in vars(b).items() if not k.startswith("__")
    }


@pytest.mark.parametrize("error", ERRORS, ids=repr)
def test_pickle_round_trip(error: FenceError) -> None:
    _same(error, pickle.loads(pickle.dumps(error)))


@pytest.mark.parametrize("serializer", ["json", "pickle"])
@pytest.mark.parametrize("error", ERRORS, ids=repr)
def test_celery_result_backend_round_trip(error: FenceError, serializer: str) -> None:
    """What a worker stores for a failed task and what the client rebuilds from it, through the backend's
    own codec (``prepare_exception``, then encode and decode, then ``exception_to_python``)."""
    app = Celery("t", backend="cache+memory://", set_as_current=False)
    app.conf.result_serializer = serializer
    app.conf.accept_content = app.conf.result_accept_content = [serializer]
    backend: Any = app.backend
    meta = backend.decode(backend.encode(backend.prepare_exception(error)))
    _same(error, backend.exception_to_python(meta))


def test_the_message_is_unchanged() -> None:
    assert str(LeaseHeld("k", "w", 1.0)) == "lease 'k' is held by w, expires in 1.0s"
    assert str(StaleToken("k", 3, None)) == "write refused for key 'k': token 3 is stale (current: unknown)"
    assert str(LeaseLost("k", 3)) == "lease lost: key 'k', token 3"
