"""The etcd store's two administrative writes: ``force_release`` and ``advance``, each one ``Txn`` that
compares the token offset (see ``EtcdStore.advance``). ``None``: the offset moved, try again."""

from __future__ import annotations

import json

from ...errors import InvalidArgument
from ...lease import MAX_TOKEN, Lease
from ..base import past_the_range
from . import gateway as etcd
from .keyspace import Keyspace

__all__ = ["HEADROOM", "advance", "force_release"]

# Tokens are revisions plus an offset, so an advance must leave room for the revisions still to come: it is
# refused when it would leave fewer than this many tokens below 2**53 - 1.
HEADROOM = 2**32


def force_release(space: Keyspace, key: str) -> int | None:
    state, epochs = space.read([etcd.get(space.k("state", key))]).first(1), space.epochs
    if state is None:
        raise InvalidArgument(f"no lease for key {key!r}")
    info = {**json.loads(state.value), "owner": None}
    info.pop("token", None)  # a strand's pinned token: the new token is this Txn's revision
    event = space.event(Lease(key, 0, ""), "admin-release")
    ops = [etcd.put(state.key, json.dumps(info)), *space.free(key), event]
    result = space.gateway.txn([etcd.modified(state.key, state.mod), space.offset_is(epochs)], ops)
    return epochs.token(result.revision) if result.succeeded else None


def advance(space: Keyspace, gap: int) -> int | None:
    revision, epochs = space.read([]).revision, space.epochs
    if revision + epochs.offset + gap > MAX_TOKEN - HEADROOM:  # nothing written yet
        raise past_the_range(gap, revision + epochs.offset)
    offset, value = epochs.advanced(gap)
    result = space.gateway.txn([space.offset_is(epochs)], [etcd.put(space.offset_key, value)])
    if not result.succeeded:
        return None
    space.read([])
    return result.revision + offset
