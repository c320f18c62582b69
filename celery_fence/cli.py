"""``celery -A app fence ...``: inspect, verify and administer the app's fence store.

Registered on Celery's ``celery.commands`` entry point (as Flower is); the store is the one the app's
``fence_store_url`` names. Exit codes: 0 done, 1 ``verify`` found violations (or a prompt was declined),
2 the command could not run (a bad setting, an unknown key, an unreachable store); errors print one line.
A command waits at most ``waits.ADMIN_LOCK_WAIT`` for a lock another process holds (SQLite's write lock,
held by a stopped or slow worker's transaction), then fails saying so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import click

from . import _cli_format as fmt
from . import _cli_recovery as recovery
from ._runtime import runtime_for
from .config import check_prune_age
from .errors import FenceError
from .lease import LeaseState
from .recovery import load_tasks, recover_abandoned
from .stores import Store, capabilities_for
from .stores.base import AdminStore, AuditStore, RecoveryStore, lacking
from .stores.urls import mask_url
from .stores.waits import ADMIN_LOCK_WAIT, lock_wait
from .verify import read_store, token_scope, verify
from .worker.bootstep import WORKER_OPTIONS

__all__ = ["fence"]

SHOWN_BY_DEFAULT = ("live", "expired", "dead")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class FenceCommandError(click.ClickException):
    """A command that could not run; exit code 2, so ``verify``'s 1 always means "violations"."""

    exit_code = 2


@contextmanager
def _store(ctx: click.Context, *, must_exist: bool = True, needs: tuple[type, ...] = ()) -> Iterator[Store]:
    """The app's store, closed afterwards; every ``FenceError`` becomes a one-line error. A store that lacks
    a role the command ``needs`` (``stores.base``: a third-party store may have the run's role only) is
    named with what it lacks."""
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("run it through Celery: celery -A yourapp fence ...")
    try:
        runtime = runtime_for(app)
        if must_exist:
            _refuse_missing_file(ctx, runtime.config.store_url)
        try:
            _require(ctx, runtime.store, needs)
            with lock_wait(ADMIN_LOCK_WAIT):  # never hang behind a stopped process's transaction
                yield runtime.store
        finally:
            runtime.close()
    except FenceError as exc:
        raise FenceCommandError(str(exc)) from exc


def _require(ctx: click.Context, store: Store, roles: tuple[type, ...]) -> None:
    for role in roles:
        if methods := lacking(store, role):
            raise FenceCommandError(
                f"'fence {ctx.info_name}' needs a store with the {role.__name__} role; {mask_url(store.url)} "
                f"lacks {', '.join(methods)} (see celery_fence.stores.base)"
            )


def _refuse_missing_file(ctx: click.Context, url: str) -> None:
    """Reading a store file (SQLite's) that does not exist would create an empty store and report nothing."""
    path = capabilities_for(url).local_file
    if path is None or path.exists():
        return
    # Without -A (or CELERY_APP) Celery hands over its default app, which reads the default store URL.
    named = ctx.find_root().params.get("app") is not None
    hint = "" if named else "; no app was named: run it as 'celery -A yourapp fence ...' to read its store"
    raise FenceCommandError(
        f"no fence store at {path.resolve()}: check fence_store_url (a relative path is relative to the "
        f"current directory) or create it with 'celery -A yourapp fence migrate'{hint}"
    )


def _duration(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    """Seconds, or a number with a unit: ``30s``, ``15m``, ``12h``, ``7d``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value)
    if match is None:
        raise click.BadParameter(f"{value!r} is not a duration such as 3600, 30s, 15m, 12h or 7d")
    return float(match.group(1)) * UNITS[match.group(2)]


@click.group(name="fence")
def fence() -> None:
    """Fenced leases: inspect, verify and administer the app's fence store."""


@fence.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade the store's fence_* tables (idempotent)."""
    with _store(ctx, must_exist=False) as store:
        store.migrate()
        click.echo(f"fence schema is up to date on {mask_url(store.url)}")


@fence.command()
@click.option("--all", "show_all", is_flag=True, help="Also list released and finished keys.")
@click.option("--internal", is_flag=True, help="Also list celery-fence's own keys (celery-fence:...).")
@click.pass_context
def leases(ctx: click.Context, show_all: bool, internal: bool) -> None:
    """Live and expired leases (and dead keys); --all lists every key."""
    with _store(ctx, needs=(AdminStore,)) as store:
        states = [
            s
            for s in store.leases()
            if (show_all or fmt.state(s) in SHOWN_BY_DEFAULT) and (internal or not recovery.internal(s.key))
        ]
        copies = {s.key: _copies(store, s) for s in states}
    if not states:
        click.echo("no leases" if show_all else "no live or expired leases (--all lists every key)")
        return
    rows = [
        [s.key, str(s.token), s.owner or "-", fmt.state(s), fmt.seconds(s.expires_in), copies[s.key]]
        for s in states
    ]
    fmt.table(["KEY", "TOKEN", "OWNER", "STATE", "EXPIRES_IN", "RECOVERY"], rows)


def _copies(store: Store, state: LeaseState) -> str:
    """The RECOVERY column: a started copy is lost only if its lease expired; the key's history says
    whether its holder (running, or the run that completed) is the last copy started (one read, and only
    for a key with started copies that is not expired)."""
    if not state.recoveries or fmt.state(state) in ("expired", "dead") or lacking(store, AuditStore):
        return fmt.recovery(state)
    return fmt.recovery(state, *recovery.lost_copies(state, store.history(state.key)))


@fence.command()
@click.argument("key")
@click.pass_context
def show(ctx: click.Context, key: str) -> None:
    """A key's state, its committed steps and its history."""
    with _store(ctx, needs=(AuditStore,)) as store:
        state, steps, events = store.get(key), store.steps(key), store.history(key)
    if state is None and not events:
        raise FenceCommandError(f"the store knows no key {key!r}")
    click.echo(f"key      {key}")
    if state is None:
        click.echo("state    unknown (pruned)")
    else:
        click.echo(f"state    {fmt.state(state)}, token {state.token}, owner {state.owner or '-'}")
        click.echo(f"expires  {fmt.seconds(state.expires_in)}")
        if state.done:
            click.echo(f"result   {fmt.value(state.result)}")
        if state.dead:
            click.echo(f"dead     {state.dead}")
    click.echo(f"steps    {len(steps)}")
    fmt.table(["NAME", "VALUE"], [[name, fmt.value(value)] for name, value in steps.items()], "  ")
    click.echo(f"history  {fmt.count(len(events), 'event')}")
    rows = [[fmt.iso(e.at), e.event, str(e.token), e.owner or "-", e.detail or ""] for e in events]
    fmt.table(["AT (UTC)", "EVENT", "TOKEN", "OWNER", "DETAIL"], rows, "  ")


@fence.command()
@click.argument("key")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def release(ctx: click.Context, key: str, yes: bool) -> None:
    """Admin release: bump KEY's token so any holder is fenced out, and free the key."""
    with _store(ctx, needs=(AdminStore,)) as store:
        state = store.get(key)
        if state is None:
            raise FenceCommandError(f"the store knows no key {key!r}")
        if not yes:
            click.confirm(
                f"Release {key!r} ({fmt.state(state)}, token {state.token}, owner {state.owner or '-'})? "
                f"{fmt.release_effect(state, done=False).capitalize()}",
                abort=True,
            )
        token = store.force_release(key)
    click.echo(f"released {key!r}: token is now {token} (was {state.token}); {fmt.release_effect(state)}")


@fence.command(name="verify")
@click.option("--key", help="Check one key only.")
@click.option("--internal", is_flag=True, help="Also check celery-fence's own keys (celery-fence:...).")
@click.pass_context
def verify_command(ctx: click.Context, key: str | None, internal: bool) -> None:
    """Check the history for fencing violations; exit code 1 if any."""
    with _store(ctx, needs=(AuditStore, AdminStore)) as store:
        events, steps = read_store(store, key)
    if key is None and not internal:  # the recoverer's election is no run of the user's
        events = [e for e in events if not recovery.internal(e.key)]
        steps = {k: v for k, v in steps.items() if not recovery.internal(k)}
    violations = verify(events, steps, scope=token_scope(store))
    for v in violations:
        at = "" if v.event is None else f"  [{fmt.iso(v.event.at)}]"
        click.echo(f"{v.key}  {v.rule}: {v.detail}{at}")
    summary = f"in {fmt.count(len(events), 'event')} over {fmt.count(len(steps), 'key')}"
    if violations:
        click.echo(f"{fmt.count(len(violations), 'violation')} {summary}")
        ctx.exit(1)
    click.echo(f"no violations {summary}")


@fence.command()
@click.option(
    "--older-than", callback=_duration, required=True, help="Age of finished keys: 3600, 30s, 15m, 12h, 7d."
)
@click.option("--force", is_flag=True, help="Prune younger keys than fence_prune_min_age too.")
@click.pass_context
def prune(ctx: click.Context, older_than: float, force: bool) -> None:
    """Drop keys finished more than --older-than ago (tokens never go back).

    Each pruned key leaves one 'pruned' event in the history. --older-than must be at least
    fence_prune_min_age (default: the broker's visibility_timeout, else 3600 s), or a message the broker
    redelivers after the prune runs the finished task again; --force prunes younger keys anyway.
    """
    with _store(ctx, needs=(AdminStore,)) as store:
        floor = check_prune_age(ctx.obj.app.conf, older_than, force)  # refused: the store is unchanged
        count = store.prune(older_than)
    click.echo(f"pruned {fmt.count(count, 'finished key')} older than {fmt.seconds(older_than)}")
    if older_than < floor:
        warning = "a redelivered message of a pruned key runs again ('fence verify': reopened-after-prune)"
        click.echo(f"forced below fence_prune_min_age ({fmt.seconds(floor)}): {warning}", err=True)


@fence.command()
@click.option("--gap", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.pass_context
def advance(ctx: click.Context, gap: int) -> None:
    """Move the token counter forward by --gap, after a store failover or restore.

    A failover to an asynchronous replica or a restore from backup can move the counter back below tokens
    already issued; a store that notices refuses to issue tokens (TokenRewound) until this is run.
    """
    with _store(ctx, needs=(AdminStore,)) as store:
        floor = store.advance(gap)
    click.echo(f"token counter advanced by {gap}: every token issued from now on is above {floor}")
    click.echo("(run this after a store failover or a restore from backup: either can move the counter back)")


@fence.command()
@click.option(
    "--grace", type=float, default=None, help="Seconds a lease must have been expired (default: ttl)."
)
@click.pass_context
def recover(ctx: click.Context, grace: float | None) -> None:
    """Send again the runs whose lease expired without completion (brokers that lost their message)."""
    app = ctx.obj.app
    with _store(ctx, needs=(RecoveryStore,)) as store:
        load_tasks(app)  # as a worker does: its include, imports and autodiscovered modules
        config = runtime_for(app).config
        given = config.policy.ttl if grace is None else grace
        report = recover_abandoned(app, store, given, config.max_recoveries)
        skipped = recovery.skipped(store, report, given, default_grace=grace is None)
    for key in report.resent:
        unknown = " by name (no such task in this app: left to the workers that know it)"
        click.echo(f"re-sent {key}{unknown if key in report.foreign else ''}")
    for key in report.dead:
        click.echo(f"gave up on {key} (marked dead; see 'celery fence show {key}')")
    resent, dead = fmt.count(len(report.resent), "run"), fmt.count(len(report.dead), "key")
    click.echo(f"{resent} re-sent, {dead} marked dead")
    for group in skipped:
        click.echo(f"{fmt.count(len(group.keys), 'expired lease')} skipped: {group.reason}")


def _add_worker_options() -> None:
    """Give ``celery worker`` its ``--fence-recover`` and ``--fence-metrics-*`` options.

    Done when the ``celery`` program loads this module as a ``celery.commands`` plugin, the one moment
    before it parses ``celery worker``'s arguments that is ours: ``app.user_options["worker"]`` would need
    the app, and a ``FencedTask`` is bound to its app only when the app is finalized, after parsing."""
    from celery.bin.worker import worker

    names = {param.name for param in worker.params}
    worker.params.extend(option for option in WORKER_OPTIONS if option.name not in names)


_add_worker_options()
