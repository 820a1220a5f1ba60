"""No production file over 600 lines (issue 33 §6): a file that long holds more than one thing a reader looks for.
Production is what the wheel carries (tests/layout.py); the dev tools and the tests are not held to it."""

from __future__ import annotations

from tests.layout import REPO, production_modules

MAX_LINES = 600


def test_no_production_file_is_over_600_lines():
    modules = production_modules()
    long = sorted(f"{path.relative_to(REPO)}: {n} lines" for path in modules.values()
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert len(modules) > 140 and long == [], f"split these (at most {MAX_LINES} lines a file):\n" + "\n".join(long)
