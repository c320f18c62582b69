"""The invoices project's conftest: the app under test, and its payments table in the test's store."""

import pytest
from sqlalchemy import create_engine, text

import invoices


@pytest.fixture
def fence_app():
    # The plugin runs this app in-process, switched for each test to Celery's memory broker and result
    # backend and to the test's fence store, then puts its settings back.
    return invoices.app


@pytest.fixture
def payments(fence_store):
    """The invoice ids paid, in order: the payments table, made in the test's store database."""
    engine = create_engine(fence_store.url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE payments (invoice_id INTEGER NOT NULL, token INTEGER NOT NULL)"))

    def paid():
        with engine.connect() as conn:
            return [row.invoice_id for row in conn.execute(text("SELECT invoice_id FROM payments"))]

    yield paid
    engine.dispose()
