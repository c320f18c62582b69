"""The benchmark tables of docs/performance.md, built from a run's results (pure: made-up results, no
service): the fence's cost has a row per store and variant the run measured, and the SQLite table shows
every process count with and without transaction() on both stores."""

from __future__ import annotations

from typing import Any

from benchmarks.report import figures, targets
from benchmarks.report_tables import _fence_cost, _transactions


def _spread(value: float) -> dict[str, Any]:
    return {"median": value, "min": value, "max": value, "n": 1, "values": [value]}


def _variant(round_trips: float, cpu: float, base_cpu: float) -> dict[str, Any]:
    return {
        "round_trips_per_task": round_trips,
        "round_trips_by_kind": {"sql COMMIT": 1.0},
        "server_side_per_task": None,
        "fence_round_trips": round_trips - 3.0,
        "tasks_per_s": _spread(300.0),
        "over_unfenced": _spread(base_cpu / cpu),
        "cpu_us_per_task": {"worker": cpu - 100, "postgres": 100.0, "total": cpu},
        "fence_cpu_us_per_task": _spread(cpu - base_cpu),
        "effects_checked": "20/20",
    }


def test_the_fence_cost_table_has_a_row_per_store_and_variant_measured() -> None:
    names = ["plain_write", "fenced_write", "fenced_commit"]  # a mode added by one line is one more row
    group = {"variants": names} | {
        v: _variant(3.0 + i, 1000.0 + 500 * i, 1000.0) for i, v in enumerate(names)
    }
    cost = {"settings": {"labels": {"fenced_commit": "commit mode"}}, "postgresql": group, "sqlite": group}

    lines = _fence_cost(cost)

    rows = [line for line in lines if line.startswith("| postgresql") or line.startswith("| sqlite")]
    assert len(rows) == 6
    assert "| commit mode | 5.0 | +2 |" in rows[2]
    assert "+1000" in rows[2]
    assert figures({"fence_cost": cost})["fence_cost/sqlite/fenced_commit/fence_round_trips"] == 2.0


def test_the_commit_modes_targets_are_judged_against_the_same_write_unfenced_and_hand_written() -> None:
    names = ["plain_write", "fenced_commit", "handwritten_write"]
    pg = {"variants": names} | {v: _variant(3.0 + 2 * i, 1000.0, 1000.0) for i, v in enumerate(names)}
    pg["fenced_commit"] |= {"fence_round_trips": 0.0, "over_unfenced": _spread(0.8)}
    pg["fenced_commit"]["over_handwritten"] = _spread(1.2)
    sqlite = {"variants": names[:2]} | {v: pg[v] | {"fence_round_trips": 2.0} for v in names[:2]}
    sqlite["fenced_commit"] = sqlite["fenced_commit"] | {"over_unfenced": _spread(0.95)}
    del sqlite["fenced_commit"]["over_handwritten"]  # the hand-written fence runs on PostgreSQL only

    judged = {t["target"]: t["met"] for t in targets({"fence_cost": {"postgresql": pg, "sqlite": sqlite}})}

    assert judged == {
        "postgresql: commit mode, 1 store round trip beyond the task's own transaction": True,
        "postgresql: commit mode >= 1.1x the hand-written fence making the same write": True,
        "postgresql: commit mode >= 0.9 of an unfenced task making the same write": False,
        "sqlite: commit mode, 1 store round trip beyond the task's own transaction": False,
        "sqlite: commit mode >= 0.9 of an unfenced task making the same write": True,
    }
    rows = [line for line in _fence_cost({"postgresql": pg}) if "| postgresql" in line]
    assert "| 1.20 (1.20-1.20) |" in rows[1] and rows[2].endswith("| - | 20/20 |")


def test_the_transactions_table_puts_with_and_without_side_by_side() -> None:
    by_c = {c: _spread(1.0) for c in ("1", "2", "4")}
    cell = {"tasks_per_s": _spread(250.0), "cpu_us_per_task": {"worker": 2000.0, "postgres": 700.0}}
    store = {
        "processes": {c: {"fenced_tx": cell, "fenced_write": cell} for c in by_c},
        "with_over_without": by_c,
        "rows_written": "10/10",
    }
    tx = {
        "sqlite": store,
        "postgresql": store,
        "sqlite_over_postgresql": {"fenced_tx": by_c, "fenced_write": by_c},
    }

    lines = _transactions(tx)

    head = lines[2]
    assert "SQLite with / without" in head and "PostgreSQL with / without" in head
    assert [line.split(" |")[0] for line in lines[4:7]] == ["| 1", "| 2", "| 4"]
    assert all(line.count("|") == head.count("|") for line in lines[2:8])
