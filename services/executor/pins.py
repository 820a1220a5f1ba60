"""Host-key pins: the SSH host key of each worker of a node, from the Cloud TPU API, before first contact.

A worker's guest agent publishes its host keys in the node's guest attributes (namespace `hostkeys`, one
key per algorithm, the value the key's base64). The executor reads them with `getGuestAttributes` (the
executor's account needs `roles/tpu.viewer`), pins each worker's `ssh-ed25519` key, and connects only to a
host that presents exactly that key. A key that is not published yet is waited for, up to a deadline;
then the worker counts as unreachable (an infrastructure failure). Nothing is ever trusted on first use.

The executor is stateless (Cloud Run), so pins are cached in a store: production backs `HostKeyPinStore`
with the node's Firestore document (`tpus/{node}`), tests use `InMemoryPinStore`. A key line is
"ssh-ed25519 AAAA..." (type and base64). When a node is deleted its pins should be dropped with it
(`forget`), since a new node may reuse the name with new hosts.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tpuq.contracts.documents import TpuNodeState

PINNED_ALGORITHM = "ssh-ed25519"
HOST_KEYS_QUERY_PATH = "hostkeys/"
HOST_KEYS_NAMESPACE = "hostkeys"
# A node in one of these publishes no host key it has not published already.
NODE_STATES_WITHOUT_NEW_KEYS = frozenset({TpuNodeState.PREEMPTED, TpuNodeState.TERMINATED, TpuNodeState.DELETING,
                                          TpuNodeState.STOPPING, TpuNodeState.STOPPED})


class HostKeysUnavailable(Exception):
    """A worker's host key could not be read from the TPU API: never connect to it."""


class HostKeySource(Protocol):
    def published(self, node: str) -> Mapping[int, str]:
        """worker id -> "ssh-ed25519 BASE64" for every worker whose key is published (maybe none yet).

        Raises HostKeysUnavailable when waiting cannot help (no permission); other errors are transient."""
        ...


def host_keys_from_guest_attributes(per_worker: Sequence[Any]) -> dict[int, str]:
    """`GetGuestAttributesResponse.guest_attributes` (one entry per worker, in worker order: the response
    names no worker) -> worker id -> "ssh-ed25519 BASE64". Like gcloud, only the first word of a value is
    kept and it must be base64 of an ed25519 key; anything else counts as not published."""
    keys: dict[int, str] = {}
    for worker, attributes in enumerate(per_worker):
        for item in attributes.query_value.items:
            if item.namespace != HOST_KEYS_NAMESPACE or item.key != PINNED_ALGORITHM:
                continue
            words = (item.value or "").split()
            if words and words[0] == PINNED_ALGORITHM:  # tolerate "ssh-ed25519 BASE64" too
                words = words[1:]
            if words and _is_ed25519_blob(words[0]):
                keys[worker] = f"{PINNED_ALGORITHM} {words[0]}"
    return keys


def _is_ed25519_blob(b64: str) -> bool:
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    # An SSH public key blob starts with its type as a length-prefixed string.
    name = PINNED_ALGORITHM.encode()
    return blob[:4] == len(name).to_bytes(4, "big") and blob[4:4 + len(name)] == name


class GuestAttributeHostKeys:
    """HostKeySource over the Cloud TPU API (`tpu_v2.TpuClient.get_guest_attributes`)."""

    def __init__(self, client: Any):
        self.client = client

    def published(self, node: str) -> Mapping[int, str]:
        from google.api_core import exceptions
        from google.cloud import tpu_v2

        try:
            response = self.client.get_guest_attributes(
                request=tpu_v2.GetGuestAttributesRequest(name=node, query_path=HOST_KEYS_QUERY_PATH))
        except exceptions.NotFound:
            self._check_node_can_still_publish(node)
            return {}  # nothing published under hostkeys/ yet
        except exceptions.PermissionDenied as e:
            raise HostKeysUnavailable(
                f"cannot read the host keys of {node} from its guest attributes ({e.message}); the executor's "
                "service account needs roles/tpu.viewer") from None
        return host_keys_from_guest_attributes(response.guest_attributes)

    def _check_node_can_still_publish(self, node: str) -> None:
        """Keys not published yet: worth waiting for only while the node lives. A node preempted (or deleted)
        before its agent published them never will, and a start waiting its whole deadline for them holds a
        request thread for minutes (the chaos soak's preemption of a starting attempt). Any other error
        reading the node is no answer: keep waiting."""
        from google.api_core import exceptions

        try:
            state = TpuNodeState(self.client.get_node(name=node).state.name)
        except exceptions.NotFound:
            raise HostKeysUnavailable(f"{node} no longer exists: its host keys will never be published") from None
        except Exception:  # noqa: BLE001 - transient API trouble, or a state this enum lacks: keep waiting
            return
        if state in NODE_STATES_WITHOUT_NEW_KEYS:
            raise HostKeysUnavailable(f"{node} is {state.value}: its host keys will never be published")


def pins_for(
    node: str,
    workers: Sequence[int],
    store: "HostKeyPinStore",
    source: HostKeySource,
    *,
    wait_seconds: float,
    poll_seconds: float,
    max_poll_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> tuple[dict[int, str], dict[int, HostKeysUnavailable]]:
    """The pinned key of each of `workers`: from the store, else read from `source` (waiting up to
    `wait_seconds` for keys not published yet, asking after poll_seconds, then twice as long each time up
    to max_poll_seconds) and stored. Returns (pins, {worker: why it has none})."""
    interval, longest = poll_seconds, max(poll_seconds, max_poll_seconds or poll_seconds)
    pins = dict(store.get_pins(node))
    missing = [w for w in workers if w not in pins]
    deadline = monotonic() + wait_seconds
    last_error: Exception | None = None
    while missing:
        try:
            published = source.published(node)
            last_error = None
        except HostKeysUnavailable as e:
            return pins, {w: e for w in missing}
        except Exception as e:  # noqa: BLE001 - transient API trouble: keep waiting until the deadline
            published, last_error = {}, e
        fresh = {w: published[w] for w in missing if w in published}
        if fresh:
            pins = dict(store.add_pins(node, fresh))
            missing = [w for w in missing if w not in pins]
        remaining = deadline - monotonic()
        if not missing or remaining <= 0:
            break
        sleep(min(interval, remaining))
        interval = min(interval * 2, longest)
    cause = f" (last error: {type(last_error).__name__}: {last_error})" if last_error else ""
    return pins, {w: HostKeysUnavailable(
        f"no {PINNED_ALGORITHM} host key of worker {w} in the guest attributes of {node} after "
        f"{wait_seconds:.0f} s{cause}; not connecting without one") for w in missing}


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
