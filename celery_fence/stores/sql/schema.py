"""The ``fence_*`` tables as SQLAlchemy ``MetaData`` (usable in a user's Alembic autogenerate), plus the
triggers that write the audit trail.

Every state change of a lease row names itself in the row's ``event`` column and lands in ``fence_history``
in the same statement: a trigger copies each such change (PostgreSQL's acquire and complete write their
line themselves, see ``SELF_LOGGED``), so no code path can change a lease without leaving its line in the
history, and the happy path stays one statement. Another trigger refuses a token that does not go up (a
failover or restore rewound the counter).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
    inspect,
    text,
)

from ...errors import ConfigurationError
from ...lease import MAX_TOKEN

__all__ = ["SCHEMA_VERSION", "SELF_LOGGED", "metadata", "migrate", "schema_current"]

# 2: fence_leases.recovery_sent; tokens capped at 2**53 - 1 (sequence MAXVALUE, SQLite range triggers)
# 3: PostgreSQL's acquire and complete log themselves; the audit and rewind triggers are apart (SELF_LOGGED)
# 4: fence_unchanged(), which fails a transaction whose completion or claim changed no row (PostgreSQL)
SCHEMA_VERSION = 4
metadata = MetaData()
token_seq = Sequence("fence_token_seq", maxvalue=MAX_TOKEN, metadata=metadata)

fence_meta = Table(
    "fence_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)
fence_leases = Table(
    "fence_leases",
    metadata,
    Column("key", String(1024), primary_key=True),
    Column("token", BigInteger, nullable=False),
    Column("owner", String(512)),
    Column("expires_at", Float),  # store-clock epoch seconds; NULL: not held
    Column("done", Boolean, nullable=False, default=False),
    Column("result", Text),
    Column("run", Text),  # task name, arguments and options, for recovery
    Column("recoveries", Integer, nullable=False, default=0),  # recovery copies that started
    Column("recovery_sent", Integer, nullable=False, server_default="0"),  # copies sent, not started yet
    Column("dead", Text),
    Column("finished_at", Float),
    Column("recovered_at", Float),
    Column("event", String(32), nullable=False),  # the last transition; the audit trigger copies it
    Column("detail", Text),
    Index("fence_leases_expires", "expires_at"),  # recovery looks for expired leases
)
fence_history = Table(
    "fence_history",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("key", String(1024), nullable=False),
    Column("at", Float, nullable=False),
    Column("event", String(32), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("owner", String(512)),
    Column("detail", Text),
    Index("fence_history_key", "key", "id"),
    sqlite_autoincrement=True,
)
fence_steps = Table(
    "fence_steps",
    metadata,
    Column("key", String(1024), primary_key=True),
    Column("name", String(200), primary_key=True),
    Column("token", BigInteger, nullable=False),
    Column("value", Text),
    Column("at", Float, nullable=False),
)
fence_counter = Table(  # SQLite's token source; PostgreSQL uses fence_token_seq
    "fence_counter",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("value", BigInteger, nullable=False),
)

# The hot statements (acquire, complete) write their own history line in the same statement (a
# data-modifying CTE: queries.py) and mark the row with SELF_LOGGED in ``detail``; the audit trigger writes
# the line of every other change. A plpgsql call per row cost as much as the history row itself. Statements
# of an older celery-fence set ``detail`` to NULL, so during a rolling upgrade their changes are still
# logged by the trigger. The rewind guard is a trigger of its own whose WHEN clause (no function call)
# holds only for a token that did not go up.
SELF_LOGGED = "chr(31) || 'self-logged'"  # SQL: no detail a person or a step name would write

_PG_TRIGGER = """
-- Called by a completion (or a fenced commit's claim) that changed no row: it fails the statement, so the
-- COMMIT sent behind it in the same round trip is skipped, and the transaction rolls back instead.
CREATE OR REPLACE FUNCTION fence_unchanged(key text, what text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'FE002', MESSAGE = 'fence: the ' || what || ' of key ' || key
    || ' changed no row';
END $$;
CREATE OR REPLACE FUNCTION fence_leases_rewound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'FE001',
    MESSAGE = 'fence token counter rewound: ' || NEW.token || ' issued after ' || OLD.token;
END $$;
CREATE OR REPLACE FUNCTION fence_leases_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fence_history (key, at, event, token, owner, detail)
  VALUES (NEW.key, extract(epoch from clock_timestamp()), NEW.event, NEW.token, NEW.owner, NEW.detail);
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS fence_leases_rewind ON fence_leases;
CREATE TRIGGER fence_leases_rewind BEFORE UPDATE OF token ON fence_leases FOR EACH ROW
  WHEN (NEW.token < OLD.token
        OR NEW.token = OLD.token AND NEW.event IN ('acquire', 'takeover', 'admin-release'))
  EXECUTE FUNCTION fence_leases_rewound();
DROP TRIGGER IF EXISTS fence_leases_audit ON fence_leases;
CREATE TRIGGER fence_leases_audit AFTER INSERT OR UPDATE OF event ON fence_leases FOR EACH ROW
  WHEN (NEW.detail IS DISTINCT FROM (%(self)s))
  EXECUTE FUNCTION fence_leases_audit();
-- Cap the sequence of a schema made before version 2. Only when needed, and after the trigger (the lock
-- order of an acquire: lease table, then sequence), so a migrate beside running acquires cannot deadlock.
DO $$ BEGIN
  IF (SELECT seqmax FROM pg_sequence WHERE seqrelid = 'fence_token_seq'::regclass) <> %(max)s THEN
    ALTER SEQUENCE fence_token_seq MAXVALUE %(max)s;
  END IF;
END $$;
"""

RANGE_EXHAUSTED = "fence token range exhausted"

_SQLITE_AUDIT = """
  UPDATE fence_counter SET value = NEW.token WHERE id = 1 AND value < NEW.token;
  INSERT INTO fence_history (key, at, event, token, owner, detail)
  VALUES (NEW.key, (julianday('now') - 2440587.5) * 86400.0, NEW.event, NEW.token, NEW.owner, NEW.detail);
"""
_SQLITE_TRIGGERS = [
    "CREATE TRIGGER IF NOT EXISTS fence_leases_rewind BEFORE UPDATE OF token ON fence_leases"
    " WHEN NEW.token <= OLD.token BEGIN SELECT RAISE(ABORT, 'fence token counter rewound'); END",
    "CREATE TRIGGER IF NOT EXISTS fence_leases_audit_insert AFTER INSERT ON fence_leases"
    f" BEGIN {_SQLITE_AUDIT} END",
    f"CREATE TRIGGER IF NOT EXISTS fence_leases_audit_update AFTER UPDATE OF event ON fence_leases"
    f" BEGIN {_SQLITE_AUDIT} END",
    "INSERT INTO fence_counter (id, value) SELECT 1, 0 WHERE NOT EXISTS (SELECT 1 FROM fence_counter)",
    # Tokens stay in [1, 2**53 - 1]: past it SQLite would store a REAL and hand one token out twice.
    *(
        f"CREATE TRIGGER IF NOT EXISTS fence_leases_range_{op} BEFORE {op} ON fence_leases"
        f" WHEN NEW.token > {MAX_TOKEN} BEGIN SELECT RAISE(ABORT, '{RANGE_EXHAUSTED}'); END"
        for op in ("insert", "update")
    ),
]


def migrate(conn: Connection) -> None:
    """Create or upgrade the schema inside the caller's transaction. Idempotent.

    Refuses to adopt ``fence_*`` tables that celery-fence did not create (no ``fence_meta`` row).
    """
    postgres = conn.dialect.name == "postgresql"
    if postgres:  # one migrator at a time; released at commit
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('celery_fence.migrate'))"))
    existing = set(inspect(conn).get_table_names())
    if "fence_leases" in existing and "fence_meta" not in existing:
        raise ConfigurationError(
            "a table 'fence_leases' exists that celery-fence did not create; "
            "point fence_store_url at another database or rename that table"
        )
    metadata.create_all(conn, checkfirst=True)
    _add_missing_columns(conn)
    if postgres:
        conn.exec_driver_sql(_PG_TRIGGER.replace("%(max)s", str(MAX_TOKEN)).replace("%(self)s", SELF_LOGGED))
    else:
        for statement in _SQLITE_TRIGGERS:
            conn.exec_driver_sql(statement)
    version = fence_meta.c.name == "schema_version"
    row = conn.execute(fence_meta.select().where(version)).first()
    if row is None:
        conn.execute(fence_meta.insert().values(name="schema_version", value=str(SCHEMA_VERSION)))
    elif int(row.value) < SCHEMA_VERSION:  # every step above is idempotent: this was the upgrade
        conn.execute(fence_meta.update().where(version).values(value=str(SCHEMA_VERSION)))
    elif int(row.value) > SCHEMA_VERSION:
        raise ConfigurationError(
            f"the fence schema is version {row.value}, newer than this celery-fence "
            f"({SCHEMA_VERSION}); upgrade celery-fence"
        )


def _add_missing_columns(conn: Connection) -> None:
    """Upgrade a ``fence_leases`` of an older version: the columns added since, with their defaults."""
    present = {column["name"] for column in inspect(conn).get_columns("fence_leases")}
    if "recovery_sent" not in present:
        conn.exec_driver_sql(
            "ALTER TABLE fence_leases ADD COLUMN recovery_sent INTEGER NOT NULL DEFAULT 0"
        )


def schema_current(conn: Connection) -> bool:
    if not inspect(conn).has_table("fence_meta"):
        return False
    version = conn.execute(text("SELECT value FROM fence_meta WHERE name = 'schema_version'")).scalar()
    return version == str(SCHEMA_VERSION)
