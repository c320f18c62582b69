"""The store contract suite shipped in the package (``celery_fence.testing.contract``), on every harness of
harness.py (conftest.py's ``fence_contract_harness``): what a third party's store runs, the same way."""

from celery_fence.testing.contract import *  # noqa: F403
