"""Checked by ``mypy --strict`` and never run: each built-in store class conforms to the roles it plays.

The roles are protocols (:mod:`.base`); at run time a store is only asked for its methods' names
(``lacking``). Returning each class as its role here makes the type check compare every signature too,
so a store method that drifts from its role's fails ``make type``, not a user's worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import CommitStore, FencedConnectionStore, RunTransactionHandle, Store
    from .etcd.store import EtcdStore
    from .memory import MemoryCommit, MemoryStore
    from .redis.store import RedisStore
    from .sql.run import CommitTransaction, RunTransaction
    from .sql.store import SQLStore

    def _memory(store: MemoryStore) -> Store:
        return store

    def _sql(store: SQLStore) -> FencedConnectionStore:
        return store

    def _sql_run(transaction: RunTransaction) -> RunTransactionHandle:
        return transaction

    def _memory_commits(store: MemoryStore) -> CommitStore:
        return store

    def _memory_commit(transaction: MemoryCommit) -> RunTransactionHandle:
        return transaction

    def _sql_commits(store: SQLStore) -> CommitStore:
        return store

    def _sql_commit(transaction: CommitTransaction) -> RunTransactionHandle:
        return transaction

    def _redis(store: RedisStore) -> Store:
        return store

    def _etcd(store: EtcdStore) -> Store:
        return store
