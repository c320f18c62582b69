"""The shop's own tables and the effects of each pipeline step.

Every effect on these tables is written inside a fenced transaction (``self.fence.atomic_step``), so it
commits together with its step record or not at all. ``notify`` stands for an outside call (an e-mail
provider): it is protected by an idempotency key instead, the pattern for effects no transaction covers.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    insert,
    select,
    update,
)

metadata = MetaData()
stock = Table("shop_stock", metadata, Column("sku", String(20), primary_key=True), Column("qty", Integer))
payments = Table(
    "shop_payments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False),
    Column("cents", Integer, nullable=False),
)
shipments = Table(
    "shop_shipments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False),
)
audit = Table(  # one row per executed step: the demo counts them
    "shop_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False),
    Column("step", String(20), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),
)
outbox = Table(  # the "e-mail provider": it keeps one message per idempotency key
    "shop_outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(100), nullable=False),
    Column("order_id", Integer, nullable=False),
    UniqueConstraint("idempotency_key"),
)
SKU, INITIAL_STOCK, PRICE_CENTS = "widget", 1000, 1999


def create(engine: Engine) -> None:
    metadata.create_all(engine)
    with engine.begin() as conn:
        if conn.execute(select(stock.c.qty).where(stock.c.sku == SKU)).first() is None:
            conn.execute(insert(stock).values(sku=SKU, qty=INITIAL_STOCK))


def _audit(conn: Connection, order_id: int, step: str, token: int) -> None:
    row = {"order_id": order_id, "step": step, "token": token, "pid": os.getpid(), "at": time.time()}
    conn.execute(insert(audit).values(row))


def reserve_stock(conn: Connection, order_id: int, token: int) -> int:
    conn.execute(update(stock).where(stock.c.sku == SKU).values(qty=stock.c.qty - 1))
    _audit(conn, order_id, "reserve", token)
    return 1


def charge_card(conn: Connection, order_id: int, token: int) -> int:
    payment_id = conn.execute(
        insert(payments).values(order_id=order_id, cents=PRICE_CENTS)
    ).inserted_primary_key
    _audit(conn, order_id, "charge", token)
    return int(payment_id[0])


def ship(conn: Connection, order_id: int, token: int) -> int:
    shipment_id = conn.execute(insert(shipments).values(order_id=order_id)).inserted_primary_key
    _audit(conn, order_id, "ship", token)
    return int(shipment_id[0])


def notify_customer(engine: Engine, order_id: int, idempotency_key: str) -> str:
    """An outside call: the provider drops a second message with the same idempotency key."""
    with engine.begin() as conn:
        exists = conn.execute(select(outbox.c.id).where(outbox.c.idempotency_key == idempotency_key)).first()
        if exists is None:
            conn.execute(insert(outbox).values(idempotency_key=idempotency_key, order_id=order_id))
    return idempotency_key


def counts(engine: Engine) -> dict[str, Any]:
    """What the demo's summary reads."""
    with engine.connect() as conn:
        steps = conn.execute(select(audit.c.order_id, audit.c.step)).all()
        return {
            "steps": steps,
            "payments": conn.execute(select(payments.c.order_id)).scalars().all(),
            "shipments": conn.execute(select(shipments.c.order_id)).scalars().all(),
            "outbox": conn.execute(select(outbox.c.order_id)).scalars().all(),
            "stock": conn.execute(select(stock.c.qty).where(stock.c.sku == SKU)).scalar_one(),
        }
