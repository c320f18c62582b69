"""docs/testing.md shows whole test files that run in ``make test``: each block marked
``<!-- file: path -->`` is that file, character for character, so the page cannot drift from the tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
BLOCK = re.compile(r"^<!-- file: (\S+) -->\n```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_user_test_files_on_the_testing_page_are_the_files_that_run() -> None:
    blocks = BLOCK.findall(PAGE.read_text())
    shown = [path for path, _ in blocks]
    files = [
        "example_app/tests/test_in_process.py",
        *(f"example_app/invoices/{name}" for name in ("invoices.py", "conftest.py", "test_invoices.py")),
        "example_app/invoices/test_invoices_on_workers.py",
    ]
    assert shown == files
    for path, code in blocks:
        assert code == (ROOT / path).read_text(), f"docs/testing.md's copy of {path} differs from the file"
