"""The one store protocol. :mod:`celery_fence.stores.memory` is its executable specification.

Every method is one atomic operation at the store. A write is accepted if and only if its token is the key's
current token, checked in the same operation as the write. A lease that expired but that nobody took over is
still current (no newer holder exists), so renewing or completing it succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError, InvalidArgument
from ..lease import Abandoned, HistoryEvent, Lease, LeaseState

__all__ = [
    "EVENTS",
    "AdminStore",
    "AuditStore",
    "CommitStore",
    "FencedConnectionStore",
    "RecoveryStore",
    "RunStore",
    "RunTransactionHandle",
    "Store",
    "StoreClass",
    "lacking",
    "out_of_tokens",
    "past_the_range",
]

# The vocabulary of ``HistoryEvent.event``; ``fence verify`` reads these.
EVENTS = (
    "acquire",  # a free key (new, released or after an admin release) was leased
    "takeover",  # an expired, unreleased lease of another run was leased: the old holder is fenced out
    "renew-failed",  # a renew was refused: the token is no longer current or the key is finished
    "write",  # a fenced transaction committed with the current token
    "step",  # a checkpointed step committed (detail: the step name)
    "complete",  # the result was stored with the current token and the lease released
    "commit",  # a fenced commit (fence_mode="commit"): a new token issued and the key completed in one
    "release",  # the holder gave the lease back (exception or retry)
    "refused",  # a write with a stale token was rejected (detail: what was refused)
    "admin-release",  # an operator bumped the token: every holder is fenced out
    "recovered",  # an abandoned run was re-sent (detail: attempt number)
    "dead",  # recovery gave up on the key (detail: the reason)
    "gave-up",  # a run gave up before it acquired (the store was down): key marked dead (detail: the reason)
    "pruned",  # the finished key was pruned: this marker replaces its history (token: its last; no owner)
)


@runtime_checkable
class RunStore(Protocol):
    """What a run needs of a store. A third-party store implements at least this and passes the contract
    suite; the other roles are optional, and the ``fence`` commands name the one a store lacks."""

    url: str
    # The largest encoded result, step value or run record (bytes of kombu-dialect JSON) the store takes in
    # one write: a bigger one is refused with ``NotSerializable`` before anything is sent.
    max_value_bytes: int

    def migrate(self) -> None:
        """Create or upgrade the store's ``fence_*`` schema. Idempotent."""

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        """Take the lease on ``key`` if it is free or expired, with a token above every token issued before.

        ``run`` (task name, arguments, options) is kept with the lease for recovery. Raises ``LeaseHeld``
        while a live lease is held elsewhere, ``AlreadyDone`` for a finished key. The one answer without a
        new token: ``owner``'s own live lease, for an acquire retried after its reply was lost (owners are
        unique per acquisition); a released or expired lease is never handed back, whatever its owner.
        """

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        """Extend every lease whose ``(key, token)`` is current to ``ttl`` from now (store time).

        One round trip for all leases where the store allows it; never changes a token, so a renew whose
        reply was lost is harmless. Returns the leases that were lost.
        """

    def complete(self, lease: Lease, result: Any) -> None:
        """Store ``result``, mark the key done and release the lease, iff the token is current.

        Raises ``StaleToken`` (and records the refusal) otherwise.
        """

    def release(self, lease: Lease) -> None:
        """Give the lease back iff the token is current. A stale release changes nothing, quietly."""

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        """Commit checkpoint ``(key, name) = value`` iff the token is current; ``StaleToken`` otherwise."""

    def steps(self, key: str) -> dict[str, Any]:
        """The committed steps of ``key``, by name."""

    def refuse(self, lease: Lease, what: str) -> None:
        """Record that a write of this lease was refused before it reached the store (``LeaseLost``)."""

    def get(self, key: str) -> LeaseState | None:
        """The key's state, or ``None`` for a key the store has never seen (or pruned)."""

    def close(self) -> None:
        """Release the store's connections. Idempotent."""


@runtime_checkable
class AuditStore(Protocol):
    """What the audit trail needs: ``fence show``, ``fence verify``."""

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        """The audit trail of ``key`` (of every key if ``None``), oldest first."""


@runtime_checkable
class AdminStore(Protocol):
    """What administration needs: ``fence leases``, ``release``, ``prune``, ``advance``."""

    def leases(self) -> list[LeaseState]:
        """Every key the store holds, live, expired or done (for ``celery fence leases``)."""

    def force_release(self, key: str) -> int:
        """Admin: bump the key's token and free it, fencing out any holder. Returns the new token."""

    def prune(self, older_than: float) -> int:
        """Drop keys finished more than ``older_than`` seconds ago, atomically per key. Returns how many.

        A dropped key's lease, steps and history go; one ``pruned`` event (the key's last token, owner
        ``None``, store time) takes the history's place, so ``fence verify`` can tell a later acquire of the
        key (the broker redelivered a finished run: ``reopened-after-prune``). ``pruned`` events older than
        ``older_than`` go too (they were written by earlier prunes), so markers stay bounded and the store's
        size stays flat. Tokens never go back. Callers keep ``older_than`` at or above the broker's
        redelivery window (``fence_prune_min_age``); the store does not know the broker.
        """

    def advance(self, gap: int) -> int:
        """Move the token counter forward by ``gap`` (after a failover or restore). Returns the new floor."""


@runtime_checkable
class RecoveryStore(Protocol):
    """What recovery needs (``fence recover``, the recovery step), and the record of a run that gave up."""

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        """Keys whose lease expired over ``grace`` seconds ago without completion, not dead, and not
        recovered in the last ``grace * recovery_backoff(sent)`` seconds (``sent``: recovery copies not
        started yet, so the wait grows while a copy sits in a queue), oldest first."""

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        """Claim the re-send of an abandoned run, atomically, iff the key is unchanged since ``seen`` (same
        token, same counts: one recoverer wins) and still abandoned.

        A claimed copy is *sent*; the next acquire of the key *starts* it (``recoveries`` goes up by one and
        ``sent`` back to 0). Only started copies count against ``max_recoveries``: a copy still queued is
        not a failed one. Returns the attempt number (``recoveries + 1``) to re-send; 0 when the key was
        marked dead instead (``max_recoveries`` started copies were lost, or at once with
        ``max_recoveries=0``; ``reason`` is kept); ``None`` when there is nothing to do (someone took over,
        finished, or recovered it first).
        """

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        """Record that a run of ``key`` gave up before it acquired (it waited out an unavailable store), so
        ``celery fence leases`` shows the key; atomically, iff the key is free: unknown, or not done and not
        leased (released, or stranded before).

        Marks the key dead with ``reason``, keeps ``run`` (as ``acquire`` keeps it) and the key's token (0
        for a new key: no token is issued), frees it of any owner and appends a ``gave-up`` event (that
        token, no owner, ``reason``). Returns ``False``, changing nothing, for a finished key or one under a
        lease, live or expired (an expired one is recovery's). The next acquire clears ``dead``, as it does
        after recovery gave up.

        A fenced commit's FAILURE marks the key this way too (``run`` names ``ENDED_BY``,
        :func:`celery_fence.lease.marking_task_id`); such a mark also returns ``False`` on a key that a run
        of its task id marked before, so one task id ends once. Only stores declaring ``fenced_commit``
        are asked for such a mark.
        """


@runtime_checkable
class Store(RunStore, AuditStore, AdminStore, RecoveryStore, Protocol):
    """A lease store with every role: what the built-in stores are. Implementations hold their own clients
    and are created per process, after fork."""


class StoreClass(Protocol):
    """What the ``celery_fence.stores`` entry point group registers: called with the URL (and options),
    it makes a store. It may also define ``check_url(url)`` and ``capabilities_for(url)``
    (:mod:`.capabilities`)."""

    def __call__(self, url: str, /, **options: Any) -> RunStore: ...


def lacking(store: object, role: type) -> list[str]:
    """The methods of ``role`` (one of the protocols above) that ``store`` does not have."""
    wanted = [name for name, value in vars(role).items() if callable(value) and not name.startswith("_")]
    return [name for name in wanted if not callable(getattr(store, name, None))]


class RunTransactionHandle(Protocol):
    """A run's open transaction (``stores.sql.run.RunTransaction``), as the run's handle uses it."""

    @property
    def open(self) -> bool:
        """Whether it can still take blocks: ``False`` once committed, rolled back or lost."""

    @property
    def lost_work(self) -> bool:
        """It ended with earlier blocks' writes undone: the run cannot go on."""

    def block(self) -> AbstractContextManager[Any]:
        """One ``transaction()`` block, yielding the SQLAlchemy ``Connection``: undone alone if it raises."""

    def save_step(self, name: str, value: Any) -> None:
        """Record step ``name`` in this transaction: it commits with the run's completion."""

    def complete(self, result: Any) -> None:
        """Store the result, mark the key done and release the lease in this transaction, then commit."""

    def close(self) -> None:
        """End the transaction; whatever was not committed is rolled back. Idempotent."""


@runtime_checkable
class FencedConnectionStore(Store, Protocol):
    """A store whose lease rows live in a SQL database the user's tables can share."""

    def transaction(self, lease: Lease, step: str | None = None) -> AbstractContextManager[Any]:
        """A transaction on the store's database in which the lease row is checked and locked.

        With ``step``, the history records a step of that name instead of a write (see ``insert_step``).
        The token must be current when the transaction starts; the row stays locked until commit, so a
        takeover waits and then sees the outcome. Yields an SQLAlchemy ``Connection``; raises
        ``StaleToken`` (writing nothing) when the token is not current.
        """

    def insert_step(self, conn: Any, lease: Lease, name: str, value: Any) -> None:
        """Record step ``name`` inside an open ``transaction(lease, step=name)``: it commits with it."""

    def begin_run(self, lease: Lease, ttl: float) -> RunTransactionHandle:
        """Open the run's transaction (``stores.sql.run.RunTransaction``): the lease row checked and locked
        until it commits together with the run's completion, or rolls back. ``StaleToken`` if not current."""


@runtime_checkable
class CommitStore(Protocol):
    """A store that can fence a commit (``fence_mode="commit"``, docs/commit-mode.md): no lease, the key
    claimed by the run's completion inside the run's transaction."""

    def begin_commit(
        self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None
    ) -> RunTransactionHandle:
        """Open the run's transaction with a read of the key (idle for ``ttl`` at most, where the server
        can end it: PostgreSQL): ``AlreadyDone`` (the key is finished), ``LeaseHeld`` (a lease holds it) or
        ``FailedBefore`` (a run of ``run``'s task id marked it failed: ``strand``), nothing begun. Its
        ``complete(result)`` claims the key and commits: ``StaleToken`` (recorded, nothing committed) when
        another run finished, leased or so marked it."""

    def claim(self, key: str, owner: str, result: Any, run: Mapping[str, Any] | None = None) -> int:
        """The claim on its own, with no transaction around it: the key done with ``result``; its token."""


# -- the token counter's two refusals, worded alike on every store (only the store knows its counter) --


def past_the_range(gap: int, counter: int | None = None) -> InvalidArgument:
    """An ``advance`` refused (nothing changed): the counter would leave [1, 2**53 - 1]."""
    at = "" if counter is None else f" (it is at {counter})"
    return InvalidArgument(
        f"advance({gap}) would move the token counter past 2**53 - 1{at}; nothing changed: use a smaller gap"
    )


def out_of_tokens() -> ConfigurationError:
    """The counter reached 2**53 - 1 (only an ``advance`` close to it gets there): permanent."""
    return ConfigurationError(
        "the store's token counter reached 2**53 - 1 and cannot issue another token; "
        "point fence_store_url at a new store"
    )
