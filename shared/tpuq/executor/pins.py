"""Host-key pins: the SSH host key of each worker of a node, trusted on first contact.

The executor is stateless (Cloud Run), so pins live in a store: production backs
`HostKeyPinStore` with the node's Firestore document (`tpus/{node}`), tests use
`InMemoryPinStore`. A key line is "ssh-ed25519 AAAA..." (type and base64).
When a node is deleted its pins should be dropped with it (`forget`), since a
new node may reuse the name with new hosts.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol


class HostKeyPinStore(Protocol):
    def get_pins(self, node: str) -> Mapping[int, str]:
        """worker id -> pinned key line; empty when the node was never contacted."""
        ...

    def add_pins(self, node: str, pins: Mapping[int, str]) -> Mapping[int, str]:
        """Pin keys for workers that have no pin yet (first writer wins); return every pin now in force.

        Must be atomic per node (a Firestore transaction): two executors meeting a
        new node at once must end up trusting the same keys.
        """
        ...

    def forget(self, node: str) -> None:
        ...


class InMemoryPinStore:
    def __init__(self) -> None:
        self._pins: dict[str, dict[int, str]] = {}
        self._lock = threading.Lock()

    def get_pins(self, node: str) -> Mapping[int, str]:
        with self._lock:
            return dict(self._pins.get(node, {}))

    def add_pins(self, node: str, pins: Mapping[int, str]) -> Mapping[int, str]:
        with self._lock:
            current = self._pins.setdefault(node, {})
            for worker_id, key in pins.items():
                current.setdefault(worker_id, key)
            return dict(current)

    def forget(self, node: str) -> None:
        with self._lock:
            self._pins.pop(node, None)
