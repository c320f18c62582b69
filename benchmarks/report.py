"""From the results of one run: one flat key per figure, the issue's targets judged, the tables of
``docs/performance.md`` and the short summary printed last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .stats import span

DOCS = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
CASES = ("pool_process_killed", "whole_worker_killed")  # takeover
FLAT_MAX = 1.25  # "flat": the median acquire at the largest table within 25% of the smallest
LABELS = {
    "plain": "plain Celery task",
    "handwritten": "hand-written fence (psycopg defaults)",
    "handwritten_autocommit": "hand-written fence (autocommit)",
    "fenced": "FencedTask",
    "fencekit_pg": "fencekit lock + fenced_update (PostgreSQL)",
    "fencekit_redis": "fencekit lock + set_if_fresh (Redis)",
    "fencekit_celery": "fencekit idempotent_task decorator",
    "celery_once": "celery-once QueueOnce",
}


def figures(results: dict[str, Any]) -> dict[str, Any]:
    """One key per figure (``module/...``), each a number or a ``{median, min, max}``."""
    flat: dict[str, Any] = {}
    for store, group in results.get("throughput", {}).items():
        if store == "settings" or "tasks_per_s" not in group:
            continue
        for v in group["variants"]:
            flat[f"throughput/{store}/{v}/tasks_per_s"] = _mm(group["tasks_per_s"][v])
            flat[f"throughput/{store}/{v}/over_plain"] = _mm(group["ratio_to_plain"][v])
            flat[f"throughput/{store}/{v}/cpu_us_per_task"] = group["cpu_us_per_task"][v]["total"]
            if v != "fenced":
                flat[f"throughput/{store}/fenced_over_{v}"] = _mm(group["fenced_over"][v])
    for store, r in _stores(results.get("roundtrips")):
        flat[f"roundtrips/{store}/per_short_task"] = r["per_task"]
    for n, r in _stores(results.get("store_ops")):
        flat[f"store_ops/{n}_connections/library_cycles_per_s"] = _mm(r["library_cycles_per_s"])
        flat[f"store_ops/{n}_connections/direct_cycles_per_s"] = _mm(r["direct_cycles_per_s"])
        flat[f"store_ops/{n}_connections/ratio"] = _mm(r["ratio"])
    for store, sizes in _stores(results.get("renew")):
        for k, r in sizes.items():
            flat[f"renew/{store}/{k}_leases/round_trips"] = r["round_trips_per_pass"]
            flat[f"renew/{store}/{k}_leases/ms_per_interval"] = r["ms_per_pass"]["median"]
    for store, r in _stores(results.get("takeover")):
        for case in CASES:
            flat[f"takeover/{store}/{case}/seconds"] = _mm(r[case]["seconds"])
        flat[f"takeover/{store}/bound_seconds"] = r["bound_ttl_plus_interval"]
    for size, r in _stores(results.get("acquire_scaling")):
        if isinstance(r, dict):
            flat[f"acquire_scaling/{size}_rows/median_us"] = r["median_us"]
            flat[f"acquire_scaling/{size}_rows/p99_us"] = r["p99_us"]
    flat |= _curve(results.get("curve", {})) | _transactions(results.get("transactions", {}))
    return flat | _fence_cost(results.get("fence_cost", {}))


def _fence_cost(cost: dict[str, Any]) -> dict[str, Any]:
    """Per store and variant: round trips per task, CPU per task, and what the fence adds to both."""
    flat: dict[str, Any] = {}
    for store, group in _stores(cost):
        for v in group.get("variants", []):
            r, where = group[v], f"fence_cost/{store}/{v}"
            flat[f"{where}/round_trips_per_task"] = r["round_trips_per_task"]
            flat[f"{where}/fence_round_trips"] = r["fence_round_trips"]
            flat[f"{where}/cpu_us_per_task"] = r["cpu_us_per_task"]["total"]
            flat[f"{where}/fence_cpu_us_per_task"] = _mm(r["fence_cpu_us_per_task"])
            flat[f"{where}/over_unfenced"] = _mm(r["over_unfenced"])
            if "over_handwritten" in r:
                flat[f"{where}/over_handwritten"] = _mm(r["over_handwritten"])
    return flat


def _transactions(tx: dict[str, Any]) -> dict[str, Any]:
    """FencedTask writing a row with and without a fenced transaction, SQLite against PostgreSQL, at each
    process count."""
    flat: dict[str, Any] = {}
    for store in ("sqlite", "postgresql"):
        group = tx.get(store, {})
        for c, variants in group.get("processes", {}).items():
            for v, r in variants.items():
                flat[f"transactions/{store}/{c}_processes/{v}/tasks_per_s"] = _mm(r["tasks_per_s"])
        for c, r in group.get("with_over_without", {}).items():
            flat[f"transactions/{store}/{c}_processes/with_over_without"] = _mm(r)
    for v, by_c in tx.get("sqlite_over_postgresql", {}).items():
        for c, r in by_c.items():
            flat[f"transactions/{c}_processes/{v}/sqlite_over_postgresql"] = _mm(r)
    return flat


def _curve(curve: dict[str, Any]) -> dict[str, Any]:
    """Tasks/s and the worker's and the store's (PostgreSQL backends') CPU per task, at each process count
    and for the empty and the filled store."""
    flat: dict[str, Any] = {}
    processes = _stores(curve.get("processes"))
    cells = [(f"{c}_processes", v, r) for c, r in processes for v in ("plain", "fenced")]
    size = curve.get("store_size", {})
    cells += [("store_size", s, size) for s in ("empty", "full") if s in size]
    for where, v, r in cells:
        cpu = r[v]["cpu_us_per_task"]
        flat[f"curve/{where}/{v}/tasks_per_s"] = _mm(r[v]["tasks_per_s"])
        flat[f"curve/{where}/{v}/worker_cpu_us_per_task"] = cpu["worker"]
        flat[f"curve/{where}/{v}/store_cpu_us_per_task"] = cpu["postgres"]
    for c, r in processes:
        flat[f"curve/{c}_processes/fenced_over_plain"] = _mm(r["fenced_over_plain"])
        flat[f"curve/{c}_processes/fence_cpu_us_per_task"] = _mm(r["fence_cpu_us_per_task"])
    for key in ("full_over_empty", "store_cpu_full_over_empty") if size else ():
        flat[f"curve/store_size/{key}"] = _mm(size[key])
    return flat


def _stores(section: dict[str, Any] | None) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in (section or {}).items() if k != "settings" and isinstance(v, dict)]


def _mm(s: dict[str, Any]) -> dict[str, Any]:
    return {"median": s["median"], "min": s["min"], "max": s["max"]}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each ``{"target", "measured", "met"}`` (``met`` None: not measured this run)."""
    out: list[dict[str, Any]] = []
    tp = results.get("throughput", {})

    def add(target: str, measured: str, met: bool | None) -> None:
        out.append({"target": target, "measured": measured, "met": met})

    pg, rd, ed = tp.get("postgresql", {}).get("fenced_over"), tp.get("redis"), tp.get("etcd")
    if pg:  # issue 16: against the tightest hand-written fence (autocommit), the history kept
        fk, hw = pg["fencekit_pg"], pg["handwritten_autocommit"]
        target = "PostgreSQL: FencedTask >= 1.1x the autocommit hand-written fence"
        add(target, f"x{span(hw)}", hw["median"] >= 1.1)
        add("PostgreSQL: FencedTask ahead of fencekit lock + fenced_update", f"x{span(fk)}", fk["median"] > 1)
    if rd:
        plain, fk = rd["ratio_to_plain"]["fenced"], rd["fenced_over"]["fencekit_redis"]
        add("Redis: fenced/plain >= 0.9", span(plain), plain["median"] >= 0.9)
        add("Redis: FencedTask ahead of fencekit's Redis fence", f"x{span(fk)}", fk["median"] > 1)
    if ed:
        plain = ed["ratio_to_plain"]["fenced"]
        add("etcd: fenced/plain >= 0.6", span(plain), plain["median"] >= 0.6)
    rt = _stores(results.get("roundtrips"))
    if rt:
        text = ", ".join(f"{s} {r['per_task']}" for s, r in rt)
        add("exactly 2 store round trips per short task", text, all(r["per_task"] == 2 for _, r in rt))
    rn = [(s, r["10000"]["round_trips_per_pass"]) for s, r in _stores(results.get("renew")) if "10000" in r]
    if rn:
        text = ", ".join(f"{s} {n}" for s, n in rn)
        add("1 round trip per interval per process to renew 10,000 leases", text, all(n == 1 for _, n in rn))
    ops = _stores(results.get("store_ops"))
    if ops:
        text = ", ".join(f"{n} conn {span(r['ratio'])}" for n, r in ops)
        add(
            "library store operations >= 0.9 of direct SQL",
            text,
            all(r["ratio"]["median"] >= 0.9 for _, r in ops),
        )
    tk = _stores(results.get("takeover"))
    if tk:
        bound = tk[0][1]["bound_ttl_plus_interval"]
        text = ", ".join(f"{s} max {max(r[c]['seconds']['max'] for c in CASES):.2f}s" for s, r in tk)
        met = all(r[c]["within_bound"] for _, r in tk for c in CASES)
        add(f"takeover <= ttl + renew interval ({bound:.2f}s), after SIGKILL", text, met)
    out += _commit_mode_targets(results.get("fence_cost"))
    sc = results.get("acquire_scaling", {})
    if "median_ratio_largest_to_smallest" in sc:
        ratio = sc["median_ratio_largest_to_smallest"]
        add(
            f"acquire latency flat across table sizes (median 10^6 / 10^3 <= {FLAT_MAX})",
            f"{ratio}",
            ratio <= FLAT_MAX,
        )
    return out


def _commit_mode_targets(cost: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Issue 30.1, per SQL store measured: the commit mode's round trips beyond the unfenced task making
    the same write (whose own transaction is the task's: BEGIN, INSERT, COMMIT), and its tasks/s over the
    hand-written fence making the same write (PostgreSQL only) and over that unfenced task."""
    out: list[dict[str, Any]] = []
    for store, group in _stores(cost):
        r = group.get("fenced_commit")
        if r is None:
            continue
        extra = r["fence_round_trips"]
        out.append(
            {
                "target": f"{store}: commit mode, 1 store round trip beyond the task's own transaction",
                "measured": f"{r['round_trips_per_task']} per task, {extra:+g} over the unfenced task",
                "met": extra <= 1,
            }
        )
        if "over_handwritten" in r:
            hw = r["over_handwritten"]
            out.append(
                {
                    "target": f"{store}: commit mode >= 1.1x the hand-written fence making the same write",
                    "measured": f"x{span(hw)}",
                    "met": hw["median"] >= 1.1,
                }
            )
        plain = r["over_unfenced"]
        out.append(
            {
                "target": f"{store}: commit mode >= 0.9 of an unfenced task making the same write",
                "measured": span(plain),
                "met": plain["median"] >= 0.9,
            }
        )
    return out


def summary_text(results: dict[str, Any], elapsed: float) -> str:
    lines = [f"Summary ({elapsed:.0f} s; medians over rounds, min-max in brackets):"]
    for store, group in results.get("throughput", {}).items():
        if store == "settings" or "fenced_over" not in group:
            continue
        fo, plain = group["fenced_over"], group["tasks_per_s"]["plain"]["median"]
        vs = ", ".join(
            f"{v} x{fo[v]['median']:.2f}" for v in group["variants"] if v not in ("fenced", "plain")
        )
        over_plain = span(group["ratio_to_plain"]["fenced"], "{:.2f}")
        lines.append(f"  {store:<10} plain {plain:.0f}/s; fenced/plain {over_plain}; fenced over: {vs}")
    curve = results.get("curve", {})
    if "processes" in curve:
        pairs = _stores(curve["processes"])
        text = ", ".join(f"{c} {span(r['fenced_over_plain'], '{:.2f}')}" for c, r in pairs)
        lines.append(f"  curve: fenced/plain by worker processes: {text}")
    if "store_size" in curve:
        lines.append(f"  curve: 100,000 keys / empty store: {span(curve['store_size']['full_over_empty'])}")
    tx = results.get("transactions", {})
    for store in ("sqlite", "postgresql"):
        ratio = tx.get(store, {}).get("with_over_without")
        if ratio:
            text = ", ".join(f"{c} {span(r, '{:.2f}')}" for c, r in ratio.items())
            lines.append(f"  transactions: {store} with/without transaction() by worker processes: {text}")
    for store, group in _stores(results.get("fence_cost")):
        text = ", ".join(
            f"{v} {group[v]['fence_round_trips']:+g} rt {group[v]['fence_cpu_us_per_task']['median']:+.0f} µs"
            for v in group.get("variants", [])
            if v != "plain_write"
        )
        lines.append(f"  fence_cost {store}: over the unfenced task: {text}")
        for v in ("fenced_tx", "fenced_commit"):  # the statements of a run with one transaction() block
            if v in group:
                kinds = ", ".join(f"{k} {n:g}" for k, n in group[v]["round_trips_by_kind"].items())
                per_run = group[v]["round_trips_per_task"]
                lines.append(f"  fence_cost {store}: {v} {per_run:g} per run: {kinds}")
    for t in results.get("targets", []):
        mark = {True: "MET   ", False: "MISSED", None: "n/a   "}[t["met"]]
        lines.append(f"  [{mark}] {t['target']}: {t['measured']}")
    for name, error in results.get("errors", {}).items():
        lines.append(f"  [ERROR ] {name}: {error}")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The tables of docs/performance.md for this run."""
    from .report_tables import tables

    return tables(results, LABELS)


def update_docs(results: dict[str, Any]) -> bool:
    """Replace the generated part of docs/performance.md (between the markers); False if absent."""
    if not DOCS.exists():
        return False
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{markdown(results)}\n{END}{tail}")
    return True
