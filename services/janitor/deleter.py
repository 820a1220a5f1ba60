"""Shell (the Cloud TPU API): the janitor's only door to it. Exact reads, per-zone lists, one guarded delete.

`DeleteAdapter.delete(resource)` takes the resource *as read from the API* and
checks `tpuq.runtime.ownership.is_ours` before anything else; a foreign resource raises
`NotOurs` and no call is made. Nothing else in `tpuq.janitor` holds the client
(a test scans the package for delete calls), so deleting anything that is not
ours is impossible by construction.

Deletes are idempotent: NOT_FOUND means done; a delete the API refuses because
of the resource's state (PROVISIONING, a race with another deleter) is logged
and left to the next event or tick, never retried in a loop. Transient errors
are retried a few times here (tenacity), then raised as `Retryable` so Pub/Sub
redelivers the message; the redelivery reads the state again first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tpuq.runtime.concurrency import map_concurrently
from tpuq.contracts.errors import NotFound, Permanent, TpuqError, call_api
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.ownership import is_ours, resource_name

log = logging.getLogger("tpuq.janitor.delete")

# What a delete call did (for the log and the pass's report; not a stored state).
ACCEPTED = "accepted"
ALREADY_GONE = "already gone"
REFUSED = "refused"


class NotOurs(Exception):
    """A delete was asked for a resource without both of the fleet's ownership marks."""


@dataclass(frozen=True)
class DeleteOutcome:
    name: str
    result: str  # accepted | already gone | refused
    reason: str
    detail: str = ""


@dataclass
class DeleteAdapter:
    _client: Any
    fleet: FleetFile
    attempts: int = 3
    initial_wait: float = 0.1
    max_wait: float = 1.0
    max_workers: int = 16
    outcomes: list[DeleteOutcome] = field(default_factory=list)

    # ------------------------------------------------------------ calls
    def _call(self, fn, **kwargs):
        return call_api(fn, attempts=self.attempts, initial_wait=self.initial_wait, max_wait=self.max_wait, **kwargs)

    # ------------------------------------------------------------ reads
    def read(self, name: str) -> Any | None:
        """The queued resource or node by exact name; None when NOT_FOUND. Other failures raise
        (`Retryable` after retries): a failed read is "unknown", never "gone"."""
        fn = self._client.get_queued_resource if "/queuedResources/" in name else self._client.get_node
        try:
            return self._call(fn, name=name)
        except NotFound:
            return None

    def read_all_safely(self, names: list[str]) -> dict[str, Any]:
        """Exact GETs, concurrently: name -> resource, None (NOT_FOUND) or the `TpuqError` that stayed."""
        names = list(dict.fromkeys(n for n in names if n))
        if not names:
            return {}

        def read(name: str) -> Any:
            try:
                return self.read(name)
            except TpuqError as e:
                return e

        return dict(zip(names, map_concurrently(read, names, self.max_workers)))

    def list_zone(self, zone: str) -> list[Any]:
        """Every queued resource and node in one zone of the fleet's project (paged by the client)."""
        parent = f"projects/{self.fleet.project}/locations/{zone}"
        qrs = self._call(self._client.list_queued_resources, parent=parent)
        nodes = self._call(self._client.list_nodes, parent=parent)
        return [*qrs, *nodes]

    # ------------------------------------------------------------ the delete
    def delete(self, resource: Any, *, force: bool, reason: str) -> DeleteOutcome:
        """Delete a queued resource or node *as read from the API*, if and only if it is ours."""
        from google.cloud import tpu_v2

        name = resource_name(resource)
        if not is_ours(resource, self.fleet):
            log.error("refusing to delete %s (%s): it lacks fleet %s's ownership marks", name, reason, self.fleet.name)
            raise NotOurs(name)
        if "/queuedResources/" in name:
            fn, kwargs = self._client.delete_queued_resource, {
                "request": tpu_v2.DeleteQueuedResourceRequest(name=name, force=force)}
        elif "/nodes/" in name:
            fn, kwargs = self._client.delete_node, {"name": name}
        else:
            raise NotOurs(name)  # not a resource kind the janitor knows how to judge
        try:
            self._call(fn, **kwargs)  # the long-running operation is not awaited: the next read sees DELETING
            outcome = DeleteOutcome(name, ACCEPTED, reason)
        except NotFound:
            outcome = DeleteOutcome(name, ALREADY_GONE, reason)
        except Permanent as e:
            # E.g. "not supported when state is PROVISIONING": the state moved since the read. Not an error
            # loop: the next event or tick reads the state again.
            outcome = DeleteOutcome(name, REFUSED, reason, str(e))
        log.info("delete %s (%s, force=%s): %s %s", name, reason, force, outcome.result, outcome.detail)
        self.outcomes.append(outcome)
        return outcome
