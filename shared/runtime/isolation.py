"""Fault isolation for a tick's independent parts: shell helper (logs; raises `Retryable`).

A tick walks several independent things (every stored fleet, every backstop
step, every running attempt). One of them failing must never stop the others:
each runs under `Isolated.part`, whose failure is logged and remembered, and
`raise_if_any` turns what failed into one `Retryable` at the end, so Pub/Sub
redelivers the tick for what is still undone.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from tpuq.contracts.errors import Retryable


class Isolated:
    def __init__(self, what: str, log: logging.Logger):
        self.what = what
        self.log = log
        self.failures: list[str] = []

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # noqa: BLE001 - one part's trouble must not stop the others
            self.log.exception("%s: %s failed", self.what, name)
            self.failures.append(f"{name}: {e}")

    def raise_if_any(self) -> None:
        if self.failures:
            raise Retryable(f"{self.what}: " + "; ".join(self.failures))
