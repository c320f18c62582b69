"""The library's errors on a real worker: raised there, stored in its backend, rebuilt by the client."""

from __future__ import annotations

import pytest

from celery_fence import errors

from .fenced_app import raises
from .world import Cluster

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "name", ["LeaseHeld", "AlreadyDone", "LeaseLost", "StaleToken", "StoreUnavailable", "UsageError"]
)
def test_the_librarys_errors_cross_a_real_workers_result_backend(cluster: Cluster, name: str) -> None:
    """Raised in a real worker and stored in the Redis result backend (JSON), each error reaches the client
    as the same type with the same fields and message."""
    cluster.worker("a", pool="solo")
    result = raises.delay(name)
    with pytest.raises(getattr(errors, name)) as caught:
        result.get(timeout=30)
    expected = {
        "LeaseHeld": ("lease 'k' is held by host:1:abc-1, expires in 4.2s", {"owner": "host:1:abc-1"}),
        "AlreadyDone": ("key 'k' was completed with token 7", {"result": {"total": [1, 2]}}),
        "LeaseLost": ("renew refused: key 'k', token 7", {"reason": "renew refused"}),
        "StaleToken": ("complete refused for key 'k': token 7 is stale (current: 9)", {"current": 9}),
        "StoreUnavailable": ("store down", {}),
        "UsageError": ("do not commit by hand", {}),
    }[name]
    assert str(caught.value) == expected[0]
    assert all(getattr(caught.value, k) == v for k, v in expected[1].items())
