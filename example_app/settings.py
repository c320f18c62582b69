"""Configuration from the environment, with the embedded default when unset: SQLite store, filesystem
broker and ``db+sqlite`` result backend, all under one state folder (``FENCE_DEMO_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

STATE = Path(os.environ.get("FENCE_DEMO_DIR", ".fence-demo")).resolve()
QUEUE_DIR, CONTROL_DIR, PROCESSED_DIR = STATE / "queue", STATE / "control", STATE / "processed"

STORE_URL = os.environ.get("FENCE_STORE_URL") or f"sqlite:///{STATE / 'fence.db'}"
BROKER_URL = os.environ.get("CELERY_BROKER_URL") or "filesystem://"
# kombu's filesystem transport with its file writes made atomic (example_app/broker.py says why)
BROKER_TRANSPORT = "example_app.broker:Transport" if BROKER_URL.startswith("filesystem") else None
RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or f"db+sqlite:///{STATE / 'results.db'}"
LEASE_TTL = float(os.environ.get("FENCE_LEASE_TTL", "3"))
STEP_PAUSE = float(os.environ.get("SHOP_STEP_PAUSE", "0.3"))  # time between steps: the faults' window


def make_dirs() -> None:
    for folder in (STATE, QUEUE_DIR, CONTROL_DIR, PROCESSED_DIR):
        folder.mkdir(parents=True, exist_ok=True)


def broker_options() -> dict[str, object]:
    if not BROKER_URL.startswith("filesystem"):
        return {"visibility_timeout": 3600}
    return {
        "data_folder_in": str(QUEUE_DIR),
        "data_folder_out": str(QUEUE_DIR),
        "control_folder": str(CONTROL_DIR),
        "processed_folder": str(PROCESSED_DIR),
        "store_processed": False,
        "polling_interval": 0.1,
    }
