"""Every statement of the SQL store, named by operation, for PostgreSQL and SQLite.

The two dialects share one text; they differ only in the store clock, the token source and how a list of
``(key, token)`` pairs is passed in one parameter. Expiry is always judged by the database's clock:
``clock_timestamp()`` on PostgreSQL (``now()`` is the transaction's start and would accept a lease that
expired meanwhile), ``julianday('now')`` on SQLite (one machine).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import TextClause, text

from ...lease import MAX_TOKEN
from .schema import SELF_LOGGED

__all__ = ["Queries", "queries_for"]

_HELD = "NOT fence_leases.done AND fence_leases.expires_at IS NOT NULL"
_CURRENT = f"fence_leases.key = :key AND fence_leases.token = :token AND {_HELD}"


# ``lease.recovery_backoff(recovery_sent)``: graces to wait after a recovery copy that has not started.
_BACKOFF = (
    "(CASE WHEN recovery_sent <= 1 THEN 1 WHEN recovery_sent >= 6 THEN 32"
    " ELSE (1 << (recovery_sent - 1)) END)"
)


def _abandoned(now: str, grace: str = ":grace") -> str:
    """Expired over ``grace`` ago without completion, not dead, not recovered within the backoff."""
    return (
        f"NOT done AND dead IS NULL AND expires_at IS NOT NULL AND expires_at <= {now} - {grace}"
        f" AND (recovered_at IS NULL OR recovered_at <= {now} - {grace} * {_BACKOFF})"
    )


@dataclass(frozen=True)
class _Dialect:
    now: str
    next_token: str
    pairs: str  # a row source of (key, token) from one parameter :pairs
    advance: str  # no row: the gap would take the counter past MAX_TOKEN
    lock_counter: str | None  # run first in advance's transaction: no token is issued until it ends
    # An acquire that meets the row locked by its holder's open transaction fails at once (55P03, read as
    # LeaseHeld) instead of waiting behind it: the CTE's NOWAIT lock is taken because the WHERE reads it.
    probe: str = ""
    probe_where: str = "WHERE true"  # SQLite needs a WHERE on INSERT ... SELECT ... ON CONFLICT
    # PostgreSQL's acquire and complete write their own history line (schema.SELF_LOGGED); SQLite's
    # triggers are cheap and its CTEs cannot modify data.
    self_logged: str = "NULL"
    # Returned by the guard that opens a run's transaction: on PostgreSQL it sets the transaction's idle
    # timeout (:idle_ms) in the same round trip, which a SET LOCAL before it took one of its own.
    idle_timeout: str = ""
    run_id: str = "json_extract(fence_leases.run, '$.id')"  # the task id in a row's run record

    def must_change(self, statement: str, what: str) -> str:
        """``statement`` (whose changed rows are the CTE ``changed``) failing its transaction when it changed
        no row, where this dialect can (PostgreSQL: ``fence_unchanged()``), so a ``COMMIT`` sent behind it
        in the same round trip rolls back instead; elsewhere the caller sees no row and rolls back."""
        if self.self_logged == "NULL":
            return statement
        return (
            f"{statement}\n            UNION ALL SELECT fence_unchanged(:key, '{what}')"
            " WHERE NOT EXISTS (SELECT 1 FROM changed)"
        )

    def logged(self, change: str, returning: str, probe: str = "") -> str:
        """``change`` (an INSERT or UPDATE of one lease row) returning ``returning``, with its history line
        written in the same statement where this dialect does that (the row's ``event`` is the line's)."""
        if self.self_logged == "NULL":
            return f"{probe}\n{change}\nRETURNING {returning}"
        head = f"{probe}," if probe else "WITH"
        return f"""{head} changed AS ({change}
              RETURNING key, token, owner, event),
            logged AS (INSERT INTO fence_history (key, at, event, token, owner, detail)
              SELECT key, {self.now}, event, token, owner, NULL FROM changed)
            SELECT {returning} FROM changed"""


# Every nextval holds this advisory lock shared (to the end of its statement) and advance holds it
# exclusively: nextval works outside transactions, so without it an acquire could run between advance's
# read of the sequence and its setval, and the setval would move the sequence back over issued tokens.
_TOKENS_LOCK = "hashtext('celery_fence.fence_token_seq')"

_POSTGRES = _Dialect(
    now="extract(epoch from clock_timestamp())",
    next_token=f"(SELECT nextval('fence_token_seq') FROM pg_advisory_xact_lock_shared({_TOKENS_LOCK}))",
    pairs="SELECT k, t FROM unnest(CAST(:keys AS text[]), CAST(:tokens AS bigint[])) AS p(k, t)",
    advance="SELECT setval('fence_token_seq', last_value + CAST(:gap AS bigint)) FROM fence_token_seq"
    f" WHERE last_value + CAST(:gap AS bigint) <= {MAX_TOKEN}",
    lock_counter=f"SELECT pg_advisory_xact_lock({_TOKENS_LOCK})",
    probe="WITH probe AS (SELECT 1 FROM fence_leases WHERE key = :key FOR UPDATE NOWAIT)",
    probe_where="WHERE (SELECT count(*) FROM probe) >= 0",
    self_logged=f"({SELF_LOGGED})",
    idle_timeout=", set_config('idle_in_transaction_session_timeout', CAST(:idle_ms AS text), true)",
    run_id="(CAST(fence_leases.run AS json) ->> 'id')",
)
_SQLITE = _Dialect(
    now="((julianday('now') - 2440587.5) * 86400.0)",
    next_token="((SELECT value FROM fence_counter WHERE id = 1) + 1)",
    pairs="SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:pairs)",
    advance=f"UPDATE fence_counter SET value = value + :gap WHERE id = 1 AND value + :gap <= {MAX_TOKEN}"
    " RETURNING value",
    lock_counter=None,  # the transaction is BEGIN IMMEDIATE: one writer at a time
)


@dataclass(frozen=True)
class Queries:
    acquire: TextClause
    state: TextClause
    renew: TextClause
    complete: TextClause
    complete_or_fail: TextClause
    claim: TextClause
    open_read: TextClause
    release: TextClause
    guard: TextClause
    open_guard: TextClause
    insert_step: TextClause
    steps: TextClause
    log: TextClause
    log_renew_failed: TextClause
    current_token: TextClause
    history: TextClause
    history_all: TextClause
    leases: TextClause
    force_release: TextClause
    prune_steps: TextClause
    prune_history: TextClause
    prune_markers: TextClause
    prune: TextClause
    advance: TextClause
    lock_counter: TextClause | None
    abandoned: TextClause
    recover: TextClause
    strand: TextClause


def queries_for(dialect_name: str) -> Queries:
    d = _POSTGRES if dialect_name == "postgresql" else _SQLITE
    lease_cols = (
        f"key, token, owner, expires_at - {d.now} AS expires_in, done, result, dead, recoveries,"
        " recovery_sent, run"
    )
    complete = d.logged(f"""
            UPDATE fence_leases SET done = true, result = :result, expires_at = NULL,
              finished_at = {d.now}, event = 'complete', detail = {d.self_logged}
            WHERE {_CURRENT}""", "token")
    return Queries(
        # Take the lease if it is free or expired: one statement; no row back means held or done.
        acquire=text(d.logged(f"""
            INSERT INTO fence_leases (key, token, owner, expires_at, done, run, recoveries, event, detail)
            SELECT :key, {d.next_token}, :owner, {d.now} + :ttl, false, :run, 0, 'acquire', {d.self_logged}
            {d.probe_where}
            ON CONFLICT (key) DO UPDATE SET
              token = excluded.token, owner = excluded.owner, expires_at = {d.now} + :ttl,
              run = excluded.run, detail = excluded.detail, dead = NULL,
              recoveries = fence_leases.recoveries
                + CASE WHEN fence_leases.recovery_sent > 0 THEN 1 ELSE 0 END,
              recovery_sent = 0,
              event = CASE WHEN fence_leases.expires_at IS NULL THEN 'acquire' ELSE 'takeover' END
            WHERE NOT fence_leases.done
              AND (fence_leases.expires_at IS NULL OR fence_leases.expires_at <= {d.now})""",
            "token, event", probe=d.probe)),
        state=text(f"SELECT {lease_cols} FROM fence_leases WHERE key = :key"),
        # Extend every current lease; the token never changes, so a lost reply is harmless.
        renew=text(f"""
            UPDATE fence_leases SET expires_at = {d.now} + :ttl
            WHERE (key, token) IN ({d.pairs}) AND {_HELD}
            RETURNING key, token"""),
        complete=text(complete),
        # The same in a run's transaction, sent with its COMMIT: a completion that matches no row fails.
        complete_or_fail=text(d.must_change(complete, "completion")),
        # A fenced commit (fence_mode="commit"): the key done with the result, inside the run's transaction,
        # unless it is done already or leased, or a copy of this task id (:task_id) ended it FAILURE (the
        # row marked dead by that copy's run record). Two copies that reach it at once meet on the key's
        # unique index (or its row lock): the second waits for the first's transaction, then sees the row
        # it left.
        claim=text(d.must_change(d.logged(f"""
            INSERT INTO fence_leases
              (key, token, owner, expires_at, done, result, finished_at, run, recoveries, event, detail)
            SELECT :key, {d.next_token}, :owner, NULL, true, :result, {d.now}, :run, 0, 'commit',
              {d.self_logged}
            WHERE true
            ON CONFLICT (key) DO UPDATE SET
              token = excluded.token, owner = excluded.owner, expires_at = NULL, done = true,
              result = excluded.result, finished_at = excluded.finished_at, run = excluded.run, dead = NULL,
              recovery_sent = 0, event = 'commit', detail = excluded.detail
            WHERE NOT fence_leases.done
              AND (fence_leases.expires_at IS NULL OR fence_leases.expires_at <= {d.now})
              AND NOT COALESCE(fence_leases.dead IS NOT NULL AND {d.run_id} = :task_id, false)""",
            "token"), "claim")),
        # A fenced commit's first statement: the key's state (key NULL: no row) and, on PostgreSQL, the
        # transaction's idle timeout (:idle_ms), set whether the key has a row or not.
        open_read=text(f"""
            SELECT {lease_cols.replace("key,", "fence_leases.key,", 1)}
            FROM (SELECT 1{d.idle_timeout} AS idle) AS opened
            LEFT JOIN fence_leases ON fence_leases.key = :key"""),
        release=text(f"""
            UPDATE fence_leases SET expires_at = NULL, event = 'release', detail = NULL
            WHERE {_CURRENT} RETURNING token"""),
        # Check and lock the lease row for the rest of the transaction (a row lock, never KEY SHARE).
        guard=text(f"""
            UPDATE fence_leases SET event = :event, detail = :detail
            WHERE {_CURRENT} RETURNING token"""),
        open_guard=text(f"""
            UPDATE fence_leases SET event = :event, detail = :detail
            WHERE {_CURRENT} RETURNING token{d.idle_timeout}"""),
        insert_step=text(f"""
            INSERT INTO fence_steps (key, name, token, value, at)
            VALUES (:key, :name, :token, :value, {d.now})"""),
        steps=text("SELECT name, value FROM fence_steps WHERE key = :key ORDER BY at"),
        log=text(f"""
            INSERT INTO fence_history (key, at, event, token, owner, detail)
            VALUES (:key, {d.now}, :event, :token, :owner, :detail)"""),
        # A renew that lost the race with its own run's completion is no failure: not logged.
        log_renew_failed=text(f"""
            INSERT INTO fence_history (key, at, event, token, owner, detail)
            SELECT CAST(:key AS VARCHAR), {d.now}, 'renew-failed', CAST(:token AS BIGINT),
              CAST(:owner AS VARCHAR), NULL
            WHERE NOT EXISTS (SELECT 1 FROM fence_leases
              WHERE key = CAST(:key AS VARCHAR) AND token = CAST(:token AS BIGINT) AND done)"""),
        current_token=text("SELECT token FROM fence_leases WHERE key = :key"),
        history=text(
            "SELECT key, at, event, token, owner, detail FROM fence_history WHERE key = :key ORDER BY id"
        ),
        history_all=text("SELECT key, at, event, token, owner, detail FROM fence_history ORDER BY id"),
        leases=text(f"SELECT {lease_cols} FROM fence_leases ORDER BY key"),
        force_release=text(f"""
            UPDATE fence_leases SET token = {d.next_token}, owner = NULL, expires_at = NULL,
              event = 'admin-release', detail = NULL
            WHERE key = :key RETURNING token"""),
        prune_steps=text("DELETE FROM fence_steps WHERE key = :key"),
        prune_history=text("DELETE FROM fence_history WHERE key = :key"),
        prune_markers=text(f"DELETE FROM fence_history WHERE event = 'pruned' AND at <= {d.now} - :age"),
        prune=text(
            f"DELETE FROM fence_leases WHERE done AND finished_at <= {d.now} - :age RETURNING key, token"
        ),
        advance=text(d.advance),
        lock_counter=None if d.lock_counter is None else text(d.lock_counter),
        abandoned=text(f"""
            SELECT key, token, run, recoveries, recovery_sent FROM fence_leases WHERE {_abandoned(d.now)}
            ORDER BY expires_at LIMIT :limit"""),
        # One recoverer wins: the key must be unchanged since it was seen (token and both counts). A copy
        # is counted as sent here; the acquire that starts it moves it to ``recoveries``.
        recover=text(f"""
            UPDATE fence_leases SET recovered_at = {d.now},
              recovery_sent = recovery_sent + CASE WHEN recoveries < :max THEN 1 ELSE 0 END,
              dead = CASE WHEN recoveries < :max THEN NULL ELSE :reason END,
              event = CASE WHEN recoveries < :max THEN 'recovered' ELSE 'dead' END,
              detail = CASE WHEN recoveries < :max THEN CAST(recoveries + 1 AS TEXT) ELSE :reason END
            WHERE key = :key AND token = :token AND recoveries = :seen AND recovery_sent = :sent
              AND {_abandoned(d.now, grace="0")}
            RETURNING recoveries, dead"""),
        # Only a free key (new, or not done and not leased) is marked; a new one gets no token (0). A fenced
        # commit's FAILURE (:mark_task_id, its task id) does not mark a key a run of its task id marked.
        strand=text(f"""
            {d.probe}
            INSERT INTO fence_leases
              (key, token, owner, expires_at, done, run, recoveries, dead, event, detail)
            SELECT :key, 0, NULL, NULL, false, :run, 0, :reason, 'gave-up', :reason
            {d.probe_where}
            ON CONFLICT (key) DO UPDATE SET
              owner = NULL, run = excluded.run, dead = excluded.dead, event = 'gave-up',
              detail = excluded.detail
            WHERE NOT fence_leases.done AND fence_leases.expires_at IS NULL
              AND NOT COALESCE(fence_leases.dead IS NOT NULL AND {d.run_id} = :mark_task_id, false)
            RETURNING token"""),
    )
