"""Markdown tables of one run's results (the generated part of docs/performance.md)."""

from __future__ import annotations

from typing import Any

from .stats import span


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows), ""]


def _throughput(tp: dict[str, Any], labels: dict[str, str]) -> list[str]:
    s = tp.get("settings", {})
    out = [
        f"### Throughput ({s.get('rounds')} alternating rounds, {s.get('tasks_per_batch')} tasks per batch)",
        "",
    ]
    for store, g in tp.items():
        if store == "settings" or "tasks_per_s" not in g:
            continue
        out.append(f"**Lease store: {store}**")
        out.append("")
        head = [
            "variant",
            "tasks/s",
            "/ plain",
            "FencedTask over it",
            "CPU µs/task (worker + stores)",
            "effects",
        ]
        rows = []
        for v in g["variants"]:
            over = "" if v == "fenced" else f"x{span(g['fenced_over'][v], '{:.2f}')}"
            cpu = g["cpu_us_per_task"][v]
            parts = "+".join(f"{cpu[k]:.0f}" for k in cpu if k != "total" and cpu[k] >= 0.5)
            rows.append(
                [
                    labels.get(v, v),
                    span(g["tasks_per_s"][v], "{:.0f}"),
                    span(g["ratio_to_plain"][v], "{:.2f}"),
                    over,
                    f"{cpu['total']:.0f} ({parts})",
                    g["effects_checked"][v],
                ]
            )
        out += _table(head, rows)
    return out


def _cpu(cpu: dict[str, float]) -> str:
    return f"{cpu['worker']:.0f} + {cpu['postgres']:.0f}"


def _curve(curve: dict[str, Any], cores: Any) -> list[str]:
    s, out = curve.get("settings", {}), []
    each = f"{s.get('rounds')} alternating rounds, {s.get('tasks_per_batch')} tasks per batch"
    if "processes" in curve:
        out += [
            f"### Cost curve: worker processes on one PostgreSQL store ({each}; this machine has {cores} "
            "cores: read cost per task and contention, not scaling)",
            "",
        ]
        head = ["processes (-c)", "plain tasks/s", "FencedTask tasks/s", "fenced / plain"]
        head += ["CPU µs/task plain (worker + store)", "FencedTask (worker + store)", "fence's CPU µs/task"]
        head += ["effects"]
        rows = []
        for c, r in curve["processes"].items():
            plain, fenced = r["plain"], r["fenced"]
            rows.append(
                [
                    c,
                    span(plain["tasks_per_s"], "{:.0f}"),
                    span(fenced["tasks_per_s"], "{:.0f}"),
                    span(r["fenced_over_plain"], "{:.2f}"),
                    _cpu(plain["cpu_us_per_task"]),
                    _cpu(fenced["cpu_us_per_task"]),
                    span(r["fence_cpu_us_per_task"], "{:.0f}"),
                    fenced["effects_checked"],
                ]
            )
        out += _table(head, rows)
    if "store_size" in curve:
        size = curve["store_size"]
        out += [
            f"### FencedTask with {s.get('filled_keys', 0):,} finished keys in the store against an empty "
            f"store (-c {s.get('store_size_concurrency')}, {each})",
            "",
        ]
        head = ["store", "keys at the end", "tasks/s", "/ empty", "CPU µs/task (worker + store)"]
        head += ["store CPU / empty", "effects"]
        rows = [
            [
                name,
                f"{size[name]['keys_at_end']:,}",
                span(size[name]["tasks_per_s"], "{:.0f}"),
                "" if name == "empty" else span(size["full_over_empty"], "{:.2f}"),
                _cpu(size[name]["cpu_us_per_task"]),
                "" if name == "empty" else span(size["store_cpu_full_over_empty"], "{:.2f}"),
                size[name]["effects_checked"],
            ]
            for name in ("empty", "full")
        ]
        out += _table(head, rows)
    return out


def _transactions(tx: dict[str, Any] | None) -> list[str]:
    if not tx:
        return []
    s = tx.get("settings", {})
    each = f"{s.get('rounds')} alternating rounds, {s.get('tasks_per_batch')} tasks per batch"
    out = [
        "### FencedTask writing one row with and without transaction(): SQLite against PostgreSQL "
        f"(tasks/s, {each})",
        "",
    ]
    head = ["processes (-c)"]
    for store in ("SQLite", "PostgreSQL"):
        head += [f"{store} with", f"{store} without", f"{store} with / without"]
    head += ["SQLite / PostgreSQL, with", "SQLite / PostgreSQL, without"]
    rows = []
    for c in tx["sqlite"]["processes"]:
        row = [c]
        for store in ("sqlite", "postgresql"):
            cell = tx[store]["processes"][c]
            row += [span(cell[v]["tasks_per_s"], "{:.0f}") for v in ("fenced_tx", "fenced_write")]
            row.append(span(tx[store]["with_over_without"][c], "{:.2f}"))
        row += [span(tx["sqlite_over_postgresql"][v][c], "{:.2f}") for v in ("fenced_tx", "fenced_write")]
        rows.append(row)
    written = [tx["sqlite"]["rows_written"], "", "", tx["postgresql"]["rows_written"], "", "", "", ""]
    rows.append(["rows written (both variants)", *written])
    out += _table(head, rows)
    out += ["CPU µs per task, worker + PostgreSQL backends (medians over rounds):", ""]
    head = ["processes (-c)", "SQLite with", "SQLite without", "PostgreSQL with", "PostgreSQL without"]
    rows = [
        [c]
        + [
            _cpu(tx[store]["processes"][c][v]["cpu_us_per_task"])
            for store in ("sqlite", "postgresql")
            for v in ("fenced_tx", "fenced_write")
        ]
        for c in tx["sqlite"]["processes"]
    ]
    out += _table(head, rows)
    cycles = tx.get("cycles", {})
    if not cycles:
        return out
    cs = cycles.get("settings", {})
    out += [
        f"### The same cycles without Celery, with and without transaction(): latency tail "
        f"({cs.get('rounds')} rounds of {cs.get('seconds')} s; medians over rounds, min-max in brackets)",
        "",
    ]
    head = [
        "processes",
        "store, row in transaction()",
        "cycles/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "slowest 1 s window / median",
    ]
    formats = {"cycles_per_s": "{:.0f}", "p50_ms": "{:.2f}", "p99_ms": "{:.1f}", "max_ms": "{:.0f}"}
    formats["slowest_window_over_median"] = "{:.2f}"
    rows = [
        [n, kind, *(span(r[f], fmt) for f, fmt in formats.items())]
        for n, kinds in cycles.items()
        if n != "settings"
        for kind, r in kinds.items()
    ]
    return out + _table(head, rows)


def _fence_cost(cost: dict[str, Any] | None) -> list[str]:
    if not cost:
        return []
    s = cost.get("settings", {})
    labels = s.get("labels", {})
    out = [
        "### The fence's cost per task, beside an unfenced task writing the same row "
        f"(-c {s.get('concurrency')}; round trips over {s.get('round_trip_tasks')} tasks; CPU and tasks/s: "
        f"{s.get('rounds')} alternating rounds, {s.get('tasks_per_batch')} tasks per batch, etcd half)",
        "",
    ]
    head = ["lease store", "task", "round trips per task", "the fence's", "what"]
    head += ["CPU µs/task (worker + PostgreSQL + store server)", "the fence's CPU µs/task", "tasks/s"]
    head += ["/ unfenced", "/ hand-written fence, same write", "effects"]
    rows = []
    for store, group in cost.items():
        if store == "settings" or "variants" not in group:
            continue
        for v in group["variants"]:
            r, cpu = group[v], group[v]["cpu_us_per_task"]
            parts = " + ".join(f"{cpu.get(k, 0):.0f}" for k in ("worker", "postgres", "store_server"))
            rows.append(
                [
                    store,
                    labels.get(v, v),
                    r["round_trips_per_task"],
                    f"{r['fence_round_trips']:+g}",
                    ", ".join(f"{k} {n:g}" for k, n in r["round_trips_by_kind"].items()),
                    f"{cpu['total']:.0f} ({parts})",
                    span(r["fence_cpu_us_per_task"], "{:+.0f}"),
                    span(r["tasks_per_s"], "{:.0f}"),
                    span(r["over_unfenced"], "{:.2f}"),
                    span(r["over_handwritten"], "{:.2f}") if "over_handwritten" in r else "-",
                    r["effects_checked"],
                ]
            )
    return out + _table(head, rows)


def tables(results: dict[str, Any], labels: dict[str, str]) -> str:
    m = results.get("machine", {})
    out = [
        f"Run of {results.get('finished_at', '?')}, `{results.get('command', 'python -m benchmarks')}`, "
        f"{results.get('elapsed_seconds', 0):.0f} s. Machine: {m.get('cpu')}, {m.get('cores')} cores, "
        f"{m.get('memory_gib')} GiB, load average at start {m.get('load_average_at_start')}.",
        "",
    ]
    if "throughput" in results:
        out += _throughput(results["throughput"], labels)
    if "roundtrips" in results:
        rt = results["roundtrips"]
        rows = [
            [
                s,
                r["per_task"],
                ", ".join(f"{k} {v}" for k, v in r["by_kind_per_task"].items()),
                r["server_side_per_task"] if r["server_side_per_task"] is not None else "-",
            ]
            for s, r in rt.items()
            if s != "settings"
        ]
        out += ["### Store round trips per short task", ""]
        out += _table(["store", "per task", "what", "counted by the server"], rows)
    if "store_ops" in results:
        ops = results["store_ops"]
        rows = [
            [
                n,
                span(r["library_cycles_per_s"], "{:.0f}"),
                span(r["direct_cycles_per_s"], "{:.0f}"),
                span(r["ratio"], "{:.2f}"),
            ]
            for n, r in ops.items()
            if n != "settings"
        ]
        out += ["### Store operations (PostgreSQL acquire + complete cycles/s)", ""]
        out += _table(["connections", "celery-fence", "same SQL, psycopg direct", "ratio"], rows)
    if "renew" in results:
        rows = []
        for s, sizes in results["renew"].items():
            if s == "settings":
                continue
            rows.append(
                [
                    s,
                    *(
                        f"{r['round_trips_per_pass']} / {r['ms_per_pass']['median']:.1f} ms"
                        for r in sizes.values()
                    ),
                ]
            )
        out += ["### Renew: round trips / time per interval, leases held in one process", ""]
        out += _table(["store", "1 lease", "100 leases", "10,000 leases"], rows)
    if "takeover" in results:
        rows = []
        for s, r in results["takeover"].items():
            if s == "settings":
                continue
            cases = [r["pool_process_killed"], r["whole_worker_killed"]]
            within = "yes" if all(c["within_bound"] for c in cases) else "NO"
            rows.append(
                [
                    s,
                    *(span(c["seconds"], "{:.2f}") for c in cases),
                    f"{r['bound_ttl_plus_interval']:.2f}",
                    within,
                ]
            )
        out += ["### Takeover after SIGKILL: seconds to the next holder (ttl 2 s, renew interval 0.67 s)", ""]
        head = ["store", "pool process killed", "whole worker killed", "ttl + interval", "within"]
        out += _table(head, rows)
    if "acquire_scaling" in results:
        sc = results["acquire_scaling"]
        rows = [
            [f"{int(k):,}", r["median_us"], r["p99_us"], r["fill_seconds"]]
            for k, r in sc.items()
            if k.isdigit()
        ]
        out += ["### Acquire latency vs rows in fence_leases (PostgreSQL)", ""]
        out += _table(["rows", "median µs", "p99 µs", "fill s"], rows)
    if "curve" in results:
        out += _curve(results["curve"], m.get("cores"))
    out += _transactions(results.get("transactions"))
    out += _fence_cost(results.get("fence_cost"))
    if "targets" in results:
        rows = [
            [t["target"], t["measured"], {True: "met", False: "**missed**", None: "n/a"}[t["met"]]]
            for t in results["targets"]
        ]
        out += ["### Targets (issues 7 and 16)", ""]
        out += _table(["target", "measured", ""], rows)
    return "\n".join(out)
