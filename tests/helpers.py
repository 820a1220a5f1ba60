"""Small helpers the test packages share."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds.

    A poll that raises means "not yet" (a server still starting, an object not yet written).
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - a poll that raises is "not yet"
            last_error = e
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_error!r})" if last_error else ""))


def fleets_only_context(fleets: dict):
    """A handler context whose Firestore holds only `fleets/{name}`: name -> a FleetFile, or a raw dict stored as
    the fleet file (one that does not validate, say), for a tick's loop over the fleets."""
    from types import SimpleNamespace

    docs = {name: {"fleet": f if isinstance(f, dict) else f.model_dump(mode="json")} for name, f in fleets.items()}

    class Fleets:
        def stream(self):
            return iter(SimpleNamespace(id=name, to_dict=lambda doc=doc: doc) for name, doc in docs.items())

    return SimpleNamespace(clients=SimpleNamespace(firestore=SimpleNamespace(collection=lambda _name: Fleets())))
