"""``python -m benchmarks.run_path [--store URL]``: the celery-fence modules one ordinary run crosses.

One fenced task with a checkpointed step runs twice through ``apply()`` (Celery's tracer, in this process)
on a store of its own (SQLite by default): the first run opens the store and starts the runtime, the second
is the ordinary run that is counted. Every Python function called during it, in any thread, is seen by a
profile hook; the modules of ``celery_fence`` they belong to (the fault kit excluded) are printed with the
count of calls each, and their number last.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from celery import Celery

from celery_fence import FencedTask
from celery_fence._runtime import runtime_for


def modules_of_one_run(store_url: str) -> Counter[str]:
    app = Celery("run-path", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(fence_store_url=store_url, task_store_eager_result=True)

    @app.task(base=FencedTask, bind=True, name="path.charge", fence_key="invoice:{invoice_id}", shared=False)
    def charge(self: Any, invoice_id: int) -> int:
        return int(self.fence.step("total", lambda: invoice_id * 100))

    charge.apply((1,)).get()  # opens the store, starts the runtime: not an ordinary run's work
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("celery_fence") and not name.startswith("celery_fence.testing"):
                seen[name] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        charge.apply((2,)).get()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        runtime_for(app).close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="the store URL (default: a SQLite file in a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.store or f"sqlite:///{Path(folder) / 'fence.db'}"
        seen = modules_of_one_run(url)
    for name, calls in sorted(seen.items()):
        print(f"{calls:6d}  {name}")
    print(f"{len(seen)} modules of celery_fence on one ordinary run ({url.split(':', 1)[0]})")


if __name__ == "__main__":
    main()
