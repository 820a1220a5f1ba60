"""The small pieces every contract module shares: the strict model base and durations as people write them."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base for every user-facing model: unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


MAX_DURATION_LIMIT_SECONDS = 366 * 24 * 3600
_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: Any) -> int:
    """Seconds from 3600, "3600", "3600s", "90m", "2h", "1h30m" or "1d". Raises ValueError saying what is accepted
    (pydantic names the field: `jobs[0].max_duration: '2 hours' is not ...`)."""
    example = "a number of seconds or a duration like 90m, 2h, 1h30m"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not {example}")
    if isinstance(value, int):
        seconds = value
    else:
        text = value.strip().lower().replace(" ", "")
        m = _DURATION_RE.match(text)
        if text.isdigit():
            seconds = int(text)
        elif text and m:
            seconds = sum(int(n) * unit for n, unit in zip(m.groups(), _DURATION_UNITS.values()) if n)
        else:
            raise ValueError(f"{value!r} is not {example}")
    if not 1 <= seconds <= MAX_DURATION_LIMIT_SECONDS:
        raise ValueError(f"{value!r} must be between 1 second and "
                         f"{format_duration(MAX_DURATION_LIMIT_SECONDS)}")
    return seconds


def format_duration(seconds: float) -> str:
    """7200 -> "2h", 5400 -> "1h30m", 90 -> "1m30s", 86400 -> "1d": how a reason says a duration."""
    left = max(0, int(round(seconds)))
    parts = []
    for unit, size in _DURATION_UNITS.items():
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)
