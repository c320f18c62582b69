"""The invariants checked after every program (docs/guarantees.md: the guarantees, how a run ends), once the
program has settled.

Per key: done with exactly one effect (the committing run's writes, nobody else's) and its result, or no
effect; dead only with a record; never an abandoned lease nobody recovers. Per task id: SUCCESS if and only
if the key is done, with its result; the run whose completion committed ends SUCCESS; a task id whose body
did not end it ends ready (never PENDING with nobody responsible); a duplicate of another task id ends with
the winner's result once the key is done; a link callback fires once per SUCCESS, never with an errback.
Tokens: unique per key, and what an acquire answers was never answered before (any owner string);
``celery_fence.verify`` clean. The checks made during the run (a body run again after its FAILURE, a step's
function after the lease was known lost, a clean run that did not succeed, a give-up after a short outage)
are in ``World.rec.violations``.
"""

from __future__ import annotations

from typing import Any

from celery import states
from sqlalchemy import text

from celery_fence.verify import verify_store

from .world import COMPLETIONS, USER_ENDS, World

__all__ = ["check"]


def check(world: World) -> list[str]:
    problems = list(world.rec.violations)
    for key in sorted(set(world.rec.tasks.values())):
        problems += _key(world, key)
        problems += [f"{key}: verify: {v}" for v in verify_store(world.raw, key)]
    problems += _tokens(world)
    return problems


def _key(world: World, key: str) -> list[str]:
    rec, state = world.rec, world.pruned.get(key) or world.raw.get(key)
    done, dead = bool(state and state.done), bool(state and state.dead)
    problems = []
    completes = [e for e in world.raw.history(key) if e.event in COMPLETIONS and key not in world.pruned]
    if len(completes) > 1:
        problems.append(f"{key}: completed {len(completes)} times")
    if state is not None and not done and not dead and state.expires_in is not None:
        problems.append(f"{key}: a lease (token {state.token}) is left after settling: nobody recovers it")
    # The completion's token: an admin release of a done key moves its token on (still done, nobody fenced).
    done_by = completes[0].token if completes else world.done_by.get(key, state.token if state else None)
    if world.committing:  # a fenced commit's run has token 0 in its body: its owner names it
        owner = completes[0].owner if completes else world.done_owner.get(key, state.owner if state else None)
        committed_by = rec.owner_task.get(owner) if done and owner else None
        problems += _commit_effects(world, key, owner if done else None)
    else:
        committed_by = rec.token_task.get(done_by) if done and done_by else None
        problems += _effects(world, key, done_by if done else None)
    for task_id in [t for t, k in rec.tasks.items() if k == key]:
        problems += _task(world, task_id, state, committed_by)
    return problems


def _effects(world: World, key: str, token: int | None) -> list[str]:
    if not world.sql:
        return []
    with world.raw.engine.connect() as conn:
        rows = conn.execute(text("SELECT token FROM sim_effects WHERE key = :k"), {"k": key}).all()
        counts = conn.execute(
            text("SELECT name, count(*) FROM sim_steps WHERE key = :k GROUP BY name"), {"k": key}
        ).all()
    recorded = world.raw.steps(key) if key not in world.pruned else {}
    steps = {str(name): int(n) for name, n in counts}
    wrong = {name: n for name, n in steps.items() if n != 1 or (recorded and name not in recorded)}
    if wrong:
        return [f"{key}: atomic steps' writes committed {wrong} times (step records: {sorted(recorded)})"]
    writes = sum(r.writes for runs in world.rec.bodies.values() for r in runs if r.token == token)
    tokens = sorted(int(row[0]) for row in rows)
    if token is None and tokens:
        return [f"{key}: not done, yet the writes of tokens {tokens} committed"]
    if token is not None and tokens != [token] * writes:
        return [f"{key}: done by token {token} with {writes} writes, yet the effects are by tokens {tokens}"]
    return []


def _commit_effects(world: World, key: str, owner: str | None) -> list[str]:
    """A fenced commit's writes (``sim_effects.task`` holds the writing run's owner): the committing run's,
    every one it made, and nobody else's. The memory store only emulates the mode: it has none to check."""
    if not world.sql:
        return []
    with world.raw.engine.connect() as conn:
        rows = conn.execute(text("SELECT task FROM sim_effects WHERE key = :k"), {"k": key}).all()
    owners = sorted(str(row[0]) for row in rows)
    writes = sum(r.writes for runs in world.rec.bodies.values() for r in runs if owner and r.owner == owner)
    if owner is None and owners:
        return [f"{key}: not done, yet the writes of runs {owners} committed"]
    if owner is not None and owners != [owner] * writes:
        return [f"{key}: claimed by run {owner} with {writes} writes, yet the effects are by runs {owners}"]
    return []


def _task(world: World, task_id: str, state: Any, committed_by: str | None) -> list[str]:
    rec = world.rec
    status, result = world.status(task_id)
    bodies = rec.bodies.get(task_id, [])
    user_ended = bool(bodies) and bodies[-1].end in USER_ENDS
    done, dead = bool(state and state.done), bool(state and state.dead)
    links, errbacks = rec.links[task_id], rec.errbacks[task_id]
    where = f"{task_id} (key {state.key if state else None})"
    problems = []
    if links and errbacks and task_id not in rec.limited:  # N4 runs both branches: counted as the limit
        problems.append(f"{where}: both its link and its errback fired (both branches of the canvas ran)")
    if status == states.SUCCESS:
        if not done:
            problems.append(f"{where}: SUCCESS, but the key is not done (no completion committed)")
        elif result != state.result:
            problems.append(f"{where}: SUCCESS with {result!r}, the key holds {state.result!r}")
        if links != 1:
            whose = "its own run finished the key" if task_id == committed_by else "another task id did"
            problems.append(f"{where}: SUCCESS, and its link callback fired {links} times ({whose})")
        return problems
    if links:
        problems.append(f"{where}: ended {status}, yet its link callback fired {links} times")
    excused = user_ended or task_id in rec.gave_up
    if world.eager and _eager_gave_way(result):
        # apply() has no queue to send a copy to: what would be sent again raises to its caller instead,
        # a store that did not answer as StoreUnavailable (the outcome unknown, not a failure stored in a
        # result backend), a key another task id holds as LeaseHeld (docs/guarantees.md "Every exit").
        return problems
    if task_id == committed_by and task_id not in rec.limited:  # N4: its FAILURE came first and stays
        problems.append(
            f"{where}: its completion committed (the key is done), yet it ended {status} {result!r:.150}"
        )
    elif done and not excused and not (status == states.FAILURE and bodies):
        problems.append(
            f"{where}: ended {status} {result!r:.150} though the key is done: a duplicate ends with the "
            "winner's result"
        )
    elif not done and not dead and not excused and status != states.FAILURE:
        problems.append(
            f"{where}: ended {status}, the key is neither done nor dead, and no message, lease or "
            "recovery is left to run it: nobody is responsible"
        )
    return problems


def _eager_gave_way(result: Any) -> bool:
    from celery_fence import LeaseHeld, StoreUnavailable

    return isinstance(result, (StoreUnavailable, LeaseHeld))


def _tokens(world: World) -> list[str]:
    problems = []
    answered = [(key, token) for key, token, _ in world.rec.acquired]  # the actor's and the runs', in order
    seen: set[tuple[Any, int]] = set()
    for key_token in answered:
        if key_token in seen:
            problems.append(f"{key_token[0]}: token {key_token[1]} was answered by two acquires")
        seen.add(key_token)
    last: dict[str, int] = {}
    for key, token, owner in world.rec.acquired:
        if token <= last.get(key, 0):
            problems.append(f"{key}: an acquire ({owner}) answered token {token} after token {last[key]}")
        last[key] = max(token, last.get(key, 0))
    return problems
