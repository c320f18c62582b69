"""The etcd store's two administrative writes: ``force_release`` and ``advance``, each one ``Txn`` that
compares the token offset (see :meth:`EtcdStore.advance`). ``None``: the offset moved, try again."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ...errors import InvalidArgument
from ...lease import MAX_TOKEN, Lease
from ..validation import past_the_range
from . import gateway as etcd

if TYPE_CHECKING:
    from .store import EtcdStore

__all__ = ["HEADROOM", "advance", "force_release"]

# Tokens are revisions plus an offset, so an advance must leave room for the revisions still to come: it is
# refused when it would leave fewer than this many tokens below 2**53 - 1.
HEADROOM = 2**32


def force_release(store: EtcdStore, key: str) -> int | None:
    state, epochs = store._read([etcd.get(store._k("state", key))]).first(1), store._epochs
    if state is None:
        raise InvalidArgument(f"no lease for key {key!r}")
    info = {**json.loads(state.value), "owner": None}
    info.pop("token", None)  # a strand's pinned token: the new token is this Txn's revision
    event = store._event(Lease(key, 0, ""), "admin-release")
    ops = [etcd.put(state.key, json.dumps(info)), *store._free(key), event]
    result = store.gw.txn([etcd.modified(state.key, state.mod), store._offset_is(epochs)], ops)
    return epochs.token(result.revision) if result.succeeded else None


def advance(store: EtcdStore, gap: int) -> int | None:
    revision, epochs = store._read([]).revision, store._epochs
    if revision + epochs.offset + gap > MAX_TOKEN - HEADROOM:  # nothing written yet
        raise past_the_range(gap, revision + epochs.offset)
    offset, value = epochs.advanced(gap)
    result = store.gw.txn([store._offset_is(epochs)], [etcd.put(store._offset_key, value)])
    if not result.succeeded:
        return None
    store._read([])
    return result.revision + offset
