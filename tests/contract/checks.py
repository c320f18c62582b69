"""The contract suite's helpers moved into the package (``celery_fence.testing.contract.checks``); this name
stays for the tests outside tests/contract that use them."""

from celery_fence.testing.contract.checks import dump

__all__ = ["dump"]
