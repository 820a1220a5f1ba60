"""tpu_v2 objects as the API returns them, and fleets, for the janitor's pure tests."""

from __future__ import annotations

from google.cloud import tpu_v2

from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.ownership import owner_labels

PROJECT = "p-janitor"


def fleet(name: str = "f1", prefix: str = "tpuq", *, idle: int = 600, keep_warm: int = 0, count: int = 4,
          grace: float = 600.0, zones=("us-central2-b", "us-east1-d", "us-west4-a"), project: str = PROJECT,
          **entry) -> FleetFile:
    return FleetFile.model_validate({
        "name": name, "project": project, "owner_prefix": prefix, "idle_timeout_seconds": idle,
        "claim": {"orphan_grace_seconds": grace},
        "tpus": [{"id": "v4pool", "type": "v4-8", "zones": list(zones), "count": count,
                  "keep_warm_count": keep_warm, **entry}],
    })


def qr(qr_id: str, state: str, *, zone: str = "us-central2-b", labels: dict | None = None,
       project: str = PROJECT) -> tpu_v2.QueuedResource:
    parent = f"projects/{project}/locations/{zone}"
    return tpu_v2.QueuedResource(
        name=f"{parent}/queuedResources/{qr_id}",
        state=tpu_v2.QueuedResourceState(state=tpu_v2.QueuedResourceState.State[state]),
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=parent, node_id=qr_id, node=tpu_v2.Node(accelerator_type="v4-8", labels=labels or {}))]),
    )


def node(node_id: str, state: str, *, zone: str = "us-central2-b", labels: dict | None = None,
         project: str = PROJECT, queued_resource: str = "") -> tpu_v2.Node:
    return tpu_v2.Node(
        name=f"projects/{project}/locations/{zone}/nodes/{node_id}",
        state=tpu_v2.Node.State[state],
        labels=labels or {},
        queued_resource=queued_resource,
    )


def ours(f: FleetFile, request_id: str | None = "r1") -> dict:
    return owner_labels(f, request_id)
