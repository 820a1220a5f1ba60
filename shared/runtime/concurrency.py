"""Concurrent exact reads, without a thread where one would only wait for itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_concurrently(fn: Callable[[T], R], items: Iterable[T], max_workers: int) -> list[R]:
    """`[fn(x) for x in items]`, in order, on up to `max_workers` threads; in this thread for one item or one
    worker (starting a thread costs more than one API call's wait when nothing runs beside it)."""
    items = list(items)
    workers = min(max_workers, len(items))
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
