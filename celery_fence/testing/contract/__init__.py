"""The store contract suite: every test a store must pass, for the built-in stores and for yours.

Define one fixture, ``fence_contract_harness``, returning a :class:`celery_fence.testing.StoreHarness` for
your store (in your ``conftest.py``), and import the suite into a test module of yours::

    # tests/test_fence_contract.py
    from celery_fence.testing.contract import *  # noqa: F403

That module then holds every test of the suite; the plugin's ``fence_contract_*`` fixtures open your store
for each. The tests come by role (``celery_fence.stores.base``): ``run_role`` (what a run needs, which
every store must pass), ``audit_role``, ``admin_role``, ``recovery_role``, ``commit_role``
(``fence_mode="commit"``: skipped on a store declaring ``fenced_commit="no"``), ``strand``,
``prune_marker``, ``tokens`` and the bad-input modules. A test of a role your store does not have is
skipped, saying which. To take the tests of one module only, import that module's tests instead
(``from celery_fence.testing.contract.run_role import *``). See docs/stores.md.
"""

from __future__ import annotations

from . import (
    admin_role,
    audit_role,
    bad_input,
    bad_input_sweep,
    commit_role,
    odd_input,
    prune_marker,
    recovery_role,
    run_role,
    strand,
    tokens,
)

MODULES = (
    run_role,
    audit_role,
    admin_role,
    recovery_role,
    commit_role,
    strand,
    prune_marker,
    tokens,
    bad_input,
    bad_input_sweep,
    odd_input,
)
TESTS = {name: test for module in MODULES for name, test in vars(module).items() if name.startswith("test_")}
globals().update(TESTS)
# the tests only: a star import adds no helper or fixture to the module that imports the suite
__all__ = sorted(TESTS)  # noqa: PLE0605
